"""The evaluation harness. Plain Python (no Django): it is shipped to remote GPU machines.

Only relative imports inside this package, so it can be copied anywhere as `harness/`.
"""
