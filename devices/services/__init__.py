"""Use cases of the devices app: talking to agents, health, cordon and drain."""
