"""Example jobs shipped with sluice (the quickstart word count and the demo)."""
