# Convenience wrappers; the scripts work without make.
.PHONY: demo test bench lint
demo:
	./scripts/demo.sh
test:
	./scripts/test.sh
bench:
	./scripts/bootstrap.sh && .venv/bin/python scripts/bench_throughput.py
lint:
	./scripts/bootstrap.sh && .venv/bin/ruff check . && .venv/bin/mypy
