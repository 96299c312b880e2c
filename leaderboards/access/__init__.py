"""API access: hashed API tokens, pending CLI logins, submission quotas, invitations and memberships, bans and the
jobs switch (models, service layer, /api/v1 account routes, the token and link-cli pages)."""
