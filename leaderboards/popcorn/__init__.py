"""popcorn-cli wire-compatible routes, mounted at /popcorn/ (see urls.py)."""
