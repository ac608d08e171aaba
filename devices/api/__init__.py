"""REST API of the devices app: nodes (with their device grid and cordon/drain/uncordon) and devices."""
