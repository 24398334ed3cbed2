"""A small file to complete: `specdec complete docs/examples/sample.py --line 17 --character 4`."""

import math


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for d in range(2, math.isqrt(n) + 1):
        if n % d == 0:
            return False
    return True


def primes_below(limit: int) -> list[int]:
    """All primes smaller than limit, in order."""
    result = []
    
