"""Integration tests of the capture proxy (issue 3)."""
