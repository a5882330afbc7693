"""The security tests use the dispatcher's fixtures: a loopback upstream and a draining worker."""

from tests.dispatch.conftest import drain, upstream

__all__ = ["drain", "upstream"]
