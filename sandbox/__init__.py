"""The local cloud: fake provider APIs, boxes as namespaced SSH hosts, stand-in NVML, simulators.

Nothing in fleet, agent, facts, operations or deploys imports this package (the CLI's
`fleet sandbox` commands aside); they reach it through the same URLs, environment variables
and SSH a real provider offers.
"""
