"""Code that runs inside the user's ranks outside a dry run: the production
watchdog, the probe's worker, the pytest plugin's rank side, the store check-in."""
