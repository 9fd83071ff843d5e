"""What the fleet does: offers, budget, rent, check, watchdog, teardown, one-shot runs, publish,
converge and the loop."""
