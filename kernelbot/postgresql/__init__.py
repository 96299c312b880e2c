"""Django's PostgreSQL backend, with a pooled connection checked at checkout without stalling (see base.py)."""
