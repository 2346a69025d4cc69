"""The job configuration: parsed once from a submission's document, refused with the key when bad, and the
same value after the job store's JSON and the deploy RPC's msgpack."""

from __future__ import annotations

import msgpack
import pytest

from coordinator.job_store import decode, encode
from runtime.graph.job_config import ChannelConfig, JobConfig, JobConfigError, StateConfig
from runtime.graph.plan import Plan, Vertex
from runtime.graph.restore_spec import RestoreSpec

# a job record as the version before JobConfig wrote it (format 1): records on disk must still load
OLD_RECORD = (
    b'{"attempt":0,"checkpoint":{"aligned_timeout_s":null,"interval_s":1.0,"min_pause_s":0.0,"mode":"unali'
    b'gned","retain":3,"timeout_s":60.0,"tolerable_failures":0},"checksum":{"crc32":37702854,"size":1066},'
    b'"config":{"async_state":{"max_in_flight":64},"buffer_bytes":4096,"buffers_per_channel":4,"exclusive_'
    b'credits":2,"floating_credits":8,"flush_timeout_s":0.05,"inflight_target_s":null,"parallelism":{"*":2'
    b'},"scale_down_after_s":0.0,"state":{"backend":"rocksdb","work_dir":"/tmp/w"}},"ended_at":null,"entry'
    b'":"wc:build","error":"","failures":[],"final_checkpoint_id":null,"format":1,"job_id":"job-0a1b2c3d",'
    b'"last_checkpoint":null,"name":"wordcount","next_checkpoint_id":1,"rescale_s":[],"restart":{"delay_s"'
    b':0.2,"kind":"fixed","max_attempts":3,"max_delay_s":30.0,"slot_wait_s":60.0},"restart_s":[],"restarts'
    b'":0,"restored_checkpoint_id":null,"restored_from":"","state":"CREATED","submitted_at":1700000000.0,"'
    b'sys_path":"/jobs"}'
)


def test_a_submission_document_becomes_typed_settings() -> None:
    config = JobConfig.from_document({
        "buffer_bytes": 4096, "inflight_target_s": "250ms", "parallelism": {"*": 2, "Count": 3},
        "state": {"backend": "rocksdb", "work_dir": "/w", "options": {"round_trip_ms": 2}},
        "async_state": {"max_in_flight": 8}, "scale_down_after_s": "never"})
    assert config.channels == ChannelConfig(buffer_bytes=4096, inflight_target_s=0.25)
    assert dict(config.parallelism) == {"*": 2, "Count": 3}
    assert config.state.backend == "rocksdb" and config.state.work_dir == "/w" and config.state.round_trip_ms == 2
    assert dict(config.async_state) == {"max_in_flight": 8}
    assert config.scale_down_after_s == 0.0
    assert JobConfig.from_document(None) == JobConfig()


@pytest.mark.parametrize(("doc", "names"), [
    ({"buffer_bytes": 0}, "buffer_bytes"),
    ({"buffer_bytes": "big"}, "buffer_bytes"),
    ({"floating_credits": -1}, "floating_credits"),
    ({"flush_timeout_s": 0}, "flush_timeout_s"),
    ({"inflight_target_s": "soon"}, "inflight_target_s"),
    ({"parallelism": {"Count": 0}}, "parallelism"),
    ({"parallelism": [2]}, "parallelism"),
    ({"state": {"backend": "remote"}}, "remote_address"),
    ({"state": {"options": {"round_trip_ms": -1}}}, "round_trip_ms"),
    ({"state": {"colour": "blue"}}, "colour"),
    ({"scale_down_after_s": -2}, "scale_down_after_s"),
    ({"bufer_bytes": 4096}, "bufer_bytes"),
])
def test_bad_values_are_refused_naming_the_key(doc: dict[str, object], names: str) -> None:
    with pytest.raises(JobConfigError, match=names):
        JobConfig.from_document(doc)


def test_the_document_and_the_wire_form_give_back_the_same_config() -> None:
    config = JobConfig(channels=ChannelConfig(exclusive_credits=3), parallelism={"*": 4},
                       state=StateConfig(backend="remote", remote_address="h:1", options={"round_trip_ms": 1.5}),
                       async_state={"epochs": "out-of-order"}, scale_down_after_s=2.5)
    assert JobConfig.from_document(config.to_document()) == config
    assert JobConfig.from_wire(msgpack.unpackb(msgpack.packb(config.to_wire()))) == config
    # unchanged and frozen: a rescale makes a new value
    with pytest.raises(AttributeError):
        config.scale_down_after_s = 1.0  # type: ignore[misc]
    assert dict(config.with_parallelism({"Count": 2}).parallelism) == {"Count": 2}
    assert dict(config.parallelism) == {"*": 4}


def test_a_plan_with_its_config_and_restore_crosses_the_deploy_rpc() -> None:
    plan = Plan(job_id="j", attempt=2, entry="m:f", name="t", sys_path="", channel_base=0,
                vertices=[Vertex(0, [0, 1], 2, "a")], edges=[], placement={"0:0": "w", "0:1": "w"},
                workers={"w": ["h", 1]}, config=JobConfig(parallelism={"*": 2}),
                restore=RestoreSpec(path="/c/chk-3", checkpoint_id=3, tasks={"0:0": {"state": "0-0.state"}},
                                    parallelism={0: 1}, nodes={0: 1, 1: 1}))
    back = Plan.from_dict(msgpack.unpackb(msgpack.packb(plan.to_dict()), strict_map_key=False))
    assert back == plan


def test_a_job_record_written_before_typed_configs_still_loads() -> None:
    job = decode(OLD_RECORD, "job-0a1b2c3d.json")
    assert job.config == JobConfig(channels=ChannelConfig(buffer_bytes=4096), parallelism={"*": 2},
                                   state=StateConfig(backend="rocksdb", work_dir="/tmp/w"),
                                   async_state={"max_in_flight": 64}, scale_down_after_s=0.0)
    assert decode(encode(job), "again").config == job.config
