"""Helpers shared by the test suites (real external components, no mocks)."""
