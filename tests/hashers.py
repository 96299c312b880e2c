"""The suite's password hasher: PBKDF2 at a single iteration. Tests hash a password per admin user and per login
(0.6 s of CPU each at Django's default), and the hashes stay PBKDF2, which any process the tests start can check."""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneIterationPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1
