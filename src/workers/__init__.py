"""The deployable example: the pattern's e-commerce order processing, its agents and the
simulated remote payment service."""
