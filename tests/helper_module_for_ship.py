"""A module the hosts cannot import (it lives in tests/): used to check code shipping."""


def triple(v):
    return v * 3
