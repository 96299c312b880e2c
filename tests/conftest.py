"""Root fixtures. Services (PostgreSQL, Redis) come from DATABASE_URL / REDIS_URL; under CI=true a
test that needs a missing service fails instead of skipping."""
