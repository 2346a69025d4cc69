"""The install's extras and what a submission is checked for (runtime/common/extras.py, runtime/graph/admission.py),
and the one-line reason of an object-store error (runtime/common/objectstore.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime.api import (
    DiscardSink,
    FileSink,
    GeneratorSource,
    Job,
    JsonLinesSource,
    KeyedProcessFunction,
    ParquetSource,
)
from runtime.common import extras, objectstore
from runtime.connectors.nats import NatsSink, NatsSource
from runtime.graph.admission import SubmissionRefused, check_earlier_output, check_submission, needed_extras

ROOT = Path(__file__).resolve().parents[2]


class Count(KeyedProcessFunction):
    def process(self, record: Any, ctx: Any) -> None:
        ctx.emit(record)


def keyed_job(source: Any, sink: Any, backend: str | None = None) -> Job:
    job = Job("j", state_backend=backend)
    job.source(source).key_by(lambda r: r[0]).process(Count()).sink(sink)
    return job


def test_the_distribution_name_is_the_one_every_install_line_names() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(rf'^name = "{extras.DISTRIBUTION}"', pyproject, re.M)
    assert re.search(r'^sluice = "runtime.cli.main:main"', pyproject, re.M), "the command is still sluice"
    for extra in extras.EXTRAS:
        assert re.search(rf"^{extra} = \[", pyproject, re.M), f"extra {extra} is not in pyproject.toml"
    dependencies = pyproject.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "pyarrow" not in re.sub(r"#.*", "", dependencies), "pyarrow is the parquet extra, not a dependency"
    assert extras.install_line("s3", "parquet") == "pip install 'sluice-dataflow[parquet,s3]'"


def test_no_install_line_names_the_other_projects_distribution() -> None:
    tracked = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.sh", "*.toml", "deploy/*"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    stale = [f"{name}:{n}" for name in tracked if (ROOT / name).is_file()
             for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
             if re.search(r"pip install '?sluice(\[|\s|'|$)", line) and "CHANGELOG" not in name]
    assert stale == [], stale


def test_the_sources_sinks_and_backend_name_the_extras_they_need(tmp_path: Path) -> None:
    plain = keyed_job(GeneratorSource(count=10), FileSink(str(tmp_path)))
    assert needed_extras(plain) == set()
    assert needed_extras(keyed_job(JsonLinesSource("x"), DiscardSink())) == set()
    assert needed_extras(keyed_job(ParquetSource("in/"), DiscardSink())) == {"parquet"}
    assert needed_extras(plain, restore="s3://b/p/job/chk-3") == {"s3"}
    assert needed_extras(plain, restore=str(tmp_path)) == set()
    parquet_sink = keyed_job(GeneratorSource(count=10), FileSink(str(tmp_path), format="parquet"), "rocksdb")
    assert needed_extras(parquet_sink) == {"parquet", "rocksdb"}
    assert needed_extras(parquet_sink, backend="remote") == {"parquet", "remote"}
    assert needed_extras(keyed_job(NatsSource("nats://h", "S"), NatsSink("nats://h", "out"))) == {"nats"}
    unkeyed = Job("u", state_backend="rocksdb")
    unkeyed.source(GeneratorSource(count=10)).sink(DiscardSink())
    assert needed_extras(unkeyed) == set(), "no keyed state: the backend is never made"


def test_a_missing_extra_is_one_line_with_the_install_line() -> None:
    absent = extras.missing(["parquet", "rocksdb", "s3"], importable=lambda module: module != "rocksdict")
    assert absent == ["rocksdb"]
    assert extras.describe_missing(absent) == ("the `rocksdb` extra is not installed (the rocksdb state backend): "
                                               "pip install 'sluice-dataflow[rocksdb]'")
    two = extras.describe_missing(["s3", "parquet"])
    assert two.startswith("the `parquet` and `s3` extras are not installed") and two.endswith("[parquet,s3]'")
    assert extras.missing(["parquet"]) == [], "the test venv has every extra"


def test_a_submission_needing_an_absent_module_is_refused_in_a_process_without_it(tmp_path: Path) -> None:
    # sys.modules[name] = None makes the import system report the package as absent, as in a plain install
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "from runtime.api import Job, ParquetSource, DiscardSink\n"
            "from runtime.graph.admission import SubmissionRefused, check_submission\n"
            "job = Job('pq'); job.source(ParquetSource('in/')).sink(DiscardSink())\n"
            "try:\n    check_submission(job)\nexcept SubmissionRefused as exc:\n"
            "    print(exc.kind, exc)\nelse:\n    print('admitted')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={"PYTHONPATH": str(ROOT)}).stdout.strip()
    assert out == ("MissingExtra job pq: the `parquet` extra is not installed (Parquet files): "
                   "pip install 'sluice-dataflow[parquet]'"), out


def test_a_file_sink_directory_with_an_earlier_runs_files_is_refused_unless_appending(tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = keyed_job(GeneratorSource(count=10), FileSink(str(out)))
    check_submission(job)  # no directory yet
    out.mkdir()
    (out / ".part-0-0-0.jsonl.inprogress").write_text("[1]\n")  # hidden leftovers are not output
    (out / "_SUCCESS").write_text("")
    check_submission(job)
    (out / "part-0-000001-0-0.jsonl").write_text('["k", 1]\n')
    (out / "part-1-000001-0-0.jsonl").write_text('["k", 2]\n')
    with pytest.raises(SubmissionRefused) as refused:
        check_submission(job)
    assert refused.value.kind == "OutputExists"
    assert f"{out} already holds output (part-0-000001-0-0.jsonl and 1 more)" in str(refused.value)
    assert "if_exists='append'" in str(refused.value)
    check_submission(job, restore=str(tmp_path / "chk-1"))  # a restore goes on where it left off
    check_earlier_output(keyed_job(GeneratorSource(count=10), FileSink(str(out), if_exists="append")))
    with pytest.raises(ValueError, match="if_exists"):
        FileSink(str(out), if_exists="replace")


MOTO_NO_SUCH_BUCKET = (
    "Generic S3 error: Error performing list request: Error performing GET http://127.0.0.1:40169/nope?delimiter="
    "%2F&list-type=2&prefix=checkpoints%2F in 37.8ms - Server returned non-2xx status code: 404 Not Found: <?xml "
    'version="1.0" encoding="utf-8"?>\n<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not '
    "exist</Message><BucketName>nope</BucketName><RequestId>21nH</RequestId></Error>\n\nDebug source:\nGeneric {\n"
    '    store: "S3",\n' + "    ...\n" * 30 + "}")


@pytest.mark.parametrize(("text", "reason"), [
    (MOTO_NO_SUCH_BUCKET, "NoSuchBucket: The specified bucket does not exist (nope)"),
    ("Generic S3 error: Error performing GET http://10.0.0.9:9000/b?list-type=2 in 645ms, after 3 retries - "
     "error sending request: client error (Connect): tcp connect error: Connection refused (os error 111)",
     "cannot reach http://10.0.0.9:9000: Connection refused"),
    ("Generic S3 error: ... Server returned non-2xx status code: 403 Forbidden: \n\nDebug source: ...",
     "HTTP 403 Forbidden"),
    ("x" * 500, "x" * 200 + "..."),
])
def test_an_object_store_error_is_reduced_to_its_reason(text: str, reason: str) -> None:
    assert objectstore.s3_error_reason(text) == reason
