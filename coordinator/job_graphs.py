"""The job graphs the coordinator built: a job's builder runs once per submission and parallelism.

Planning a submission, checking its extras, matching a checkpoint's operators and checking that it restores
all need the job graph (runtime/graph/plan.py build_job imports the entry point and runs the user's builder);
so do every restart's plan and the autoscaler's look at the job's shape, every half second while a job runs
scaled down. The graph depends only on the entry point, the name and the parallelism overrides, and nothing
changes a built graph (rescaling checks work on copies), so each job keeps the few it was built at, until it
ends (FINISHED, FAILED, CANCELLED) or its submission is refused: then they are dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from runtime.api import Job
from runtime.graph.plan import build_job, ensure_on_path

KEEP = 8  # graphs kept per job: its asked parallelism and the last few it was scaled to


class JobGraphs:
    def __init__(self) -> None:
        self._graphs: dict[str, OrderedDict[tuple[object, ...], Job]] = {}
        self.builds = 0  # how many times a builder ran (tests)

    def get(self, job_id: str, *, entry: str, name: str, sys_path: str,
            parallelism: Mapping[str, int] | None) -> Job:
        """The job's graph at these parallelism overrides, built on first use; raises what build_job raises
        (JobLoadError, JobDefinitionError), and keeps nothing then."""
        key = (entry, name, sys_path, tuple(sorted((parallelism or {}).items())))
        graphs = self._graphs.get(job_id, OrderedDict())
        job = graphs.get(key)
        if job is None:
            ensure_on_path(sys_path)  # the submitter's directory, as on the workers
            job = build_job(entry, name, parallelism)
            self.builds += 1
            graphs[key] = job
            self._graphs[job_id] = graphs
            while len(graphs) > KEEP:
                graphs.popitem(last=False)
        else:
            graphs.move_to_end(key)
        return job

    def forget(self, job_id: str) -> None:
        """Drop the job's graphs: it ended, or its submission was refused (JobManager and the server call it)."""
        self._graphs.pop(job_id, None)

    def jobs(self) -> list[str]:
        """The jobs that have graphs kept, sorted (tests and the docs' claim that ended jobs keep none)."""
        return sorted(self._graphs)
