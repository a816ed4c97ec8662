"""Independent reference implementations used by the tests (plain numpy, written for clarity)."""
