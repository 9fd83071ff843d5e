"""The pyinfra deploy files (`pyinfra inventory.py deploys/standing.py`): run by pyinfra as
files, a package only so that the import contracts and mypy see them."""
