"""What the tests share: imported by test modules, never collected (no test_*.py here). A helper that a second
test module needs moves here; test modules do not import each other (tests/unit/test_suite_layout.py)."""
