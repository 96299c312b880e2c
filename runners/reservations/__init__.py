"""Shared GPUs: reservations with a queue and expiry, the one device allocator for runs and reservations, and usage
reports. A Django app of its own (label `reservations`) inside `runners/`, so its tables and migrations merge apart
from the inventory's."""
