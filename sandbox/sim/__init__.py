"""The simulators that sandbox boxes run: igneumd (node), igneum-miner, igneum-prover.

Each is a single-file, stdlib-only program (boxes have only Debian's python3); they are not
imported by anything. `sandbox.releases` stamps a version into them and builds the release store.
"""
