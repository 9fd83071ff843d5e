"""One-shot jobs: `python -m agent job admit|fetch|scan|gate|run|state|stop JOBDIR` (see steps).
Imports agent.base and agent.contract only; huggingface_hub and pyelftools only in the step
that needs one (fetch, scan)."""
