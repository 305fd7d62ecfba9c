"""A driver that deploys a detached query with entry partitions and a partitioned application
(``parallelism={"entry": 2, "out": 2}``) reading Parquet files and writing a ParquetSink per
partition, starts feeding it (paced), prints "fed", then sleeps until it is killed. Run by
tests/ray/test_gc_detached_entry_app_ray.py in its own process, connected to the test session's
Ray through RAY_ADDRESS; usage: ``detached_partitions_driver.py NAME IN_DIR OUT_DIR``."""
import sys
import time

from replistream import FileSource, ParquetSink, Query, deploy, seconds

PARALLELISM = {"entry": 2, "out": 2}


def build(in_dir: str):
    """The query: a 2 s keyed count over the files in ``in_dir`` (column ``t`` is the event time)."""
    q = Query("detached_parts")
    s = FileSource(in_dir, time="t").declare(q, "s", punctuate_every=seconds(1))
    s.window(size=seconds(2), by="k", aggs={"n": "count", "sv": ("v", "sum")}, name="per_k").sink("out")
    return q.build()


def main(name: str, in_dir: str, out_dir: str) -> int:
    q = build(in_dir)
    dep = deploy(q, servers=3, k=2, name=name, detached=True, parallelism=PARALLELISM,
                 sinks={"out": ParquetSink(out_dir, every=seconds(2))})
    dep.feed({"s": FileSource(in_dir, time="t")}, pace=3.0)
    print("fed", flush=True)
    time.sleep(600)  # killed meanwhile: the deployment goes on without this driver
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
