"""The `kernelbot` command-line client. Imports no Django: it talks to a server over HTTP only."""
