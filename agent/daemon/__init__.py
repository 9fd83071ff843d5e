"""The supervising daemon (`python -m agent run`): the loop, its programs, their probes and the
policies it applies each tick. Imports agent.base and agent.contract only."""
