"""A rank's footer ``device`` is an ordinal or what tracekit capture writes ("cuda:0"): neither is a bad field."""

from tracekit.trace_check import check_footer


def _meta(device: object) -> dict:
    return {"schema_version": 1, "ranks": [{"rank": 0, "device": device, "device_name": "NVIDIA H200"}]}


def test_capture_device_text_is_kept():
    for dev in ("cuda:0", 0):
        meta = _meta(dev)
        check_footer(meta, "t.parquet", 1)
        assert meta["ranks"][0]["device"] == dev  # kept, not pruned as the wrong type
        assert "bad_footer" not in str(meta)


def test_wrong_device_type_still_pruned():
    meta = _meta([1, 2])
    check_footer(meta, "t.parquet", 1)
    assert "device" not in meta["ranks"][0]
