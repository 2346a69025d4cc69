"""`python -m runtime.cli` is the `sluice` command (child processes are started this way)."""

from runtime.cli.main import main

raise SystemExit(main())
