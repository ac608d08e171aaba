"""Use cases of the scheduling app: each owns its transaction, events and side effects."""
