"""Spark on Ray through RayDP: one shared session, started with the JVM options Java 17 needs.

RayDP runs Spark's executors as Ray actors, so Spark DataFrames reach Ray's
object store without passing through the driver. On Java 17 Spark's Arrow
path needs ``--add-opens`` for several ``java.base`` packages on the driver,
the executors *and* RayDP's app master; without them
``ray.data.from_spark`` kills the app master (docs/spark.md).

>>> spark = spark_session()          # doctest: +SKIP
>>> spark.range(3).count()           # doctest: +SKIP
3
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading

from ..errors import ReplistreamError

#: ``java.base`` packages Spark 3.5 and Arrow reach into reflectively on Java 17.
OPENS = ("java.lang", "java.lang.invoke", "java.io", "java.net", "java.nio", "java.math", "java.text",
         "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "sun.nio.ch", "sun.nio.cs",
         "sun.security.action", "sun.util.calendar")

#: The JVM options passed to the driver, the executors and the RayDP app master.
JAVA_OPTIONS = " ".join(f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in OPENS)

#: Spark's JVM logging: errors only, on stderr (a packaged log4j2 configuration).
LOG4J_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")

#: Defaults sized for a small (2-core) machine; ``spark_session(configs=...)`` overrides any of them.
DEFAULT_CONFIGS = {
    "spark.driver.extraJavaOptions": JAVA_OPTIONS,
    "spark.executor.extraJavaOptions": JAVA_OPTIONS,
    "spark.ray.raydp_app_master.extraJavaOptions": JAVA_OPTIONS,
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
    # RayDP passes these as -Dlog4j2.configurationFile to Spark's driver and to its app master
    "spark.log4j.config.file.name": LOG4J_CONFIG,
    "spark.ray.log4j.config.file.name": LOG4J_CONFIG,
}

_lock = threading.Lock()
_session = None


class SparkUnavailable(ReplistreamError, RuntimeError):
    """Spark cannot start here (Java missing or too old, RayDP not installed)."""


def java_version(java: str | None = None) -> tuple[int, str]:
    """``(major version, path)`` of the Java that Spark will use (``$JAVA_HOME/bin/java``, else ``java`` on PATH).

    Raises :class:`SparkUnavailable` naming the package to install when Java is
    missing or older than 17.

    >>> java_version()[0] >= 17      # doctest: +SKIP
    True
    """
    if java is None:
        home = os.environ.get("JAVA_HOME")
        java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    install = ("install Java 17, e.g. `apt-get install openjdk-17-jre-headless` on Debian/Ubuntu "
               "(or `dnf install java-17-openjdk-headless`), and put it on PATH or set JAVA_HOME")
    if not java or not os.path.exists(java):
        where = f"JAVA_HOME={os.environ['JAVA_HOME']}" if os.environ.get("JAVA_HOME") else "PATH"
        raise SparkUnavailable(f"Spark needs Java 17 or newer, but no `java` was found on {where}: {install}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SparkUnavailable(f"Spark needs Java 17 or newer; running {java} -version failed ({e}): {install}")
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        raise SparkUnavailable(f"cannot tell the version of {java} from {out.stderr.strip()!r}: {install}")
    major = int(m.group(1))
    if major == 1 and m.group(2):  # "1.8.0_392" is Java 8
        major = int(m.group(2))
    if major < 17:
        raise SparkUnavailable(f"Spark on Ray here needs Java 17 or newer; {java} is Java {major}: {install}")
    return major, java


def spark_session(app_name: str = "replistream", num_executors: int = 1, executor_cores: int = 1,
                  executor_memory: str = "1G", configs: dict | None = None):
    """Start Spark on Ray (RayDP) with the JVM options set, or return the session already running.

    One session per process: later calls return the first session whatever
    their arguments (stop it with :func:`stop_spark` to change them). Ray is
    started with :func:`replistream.engines.ray.init_ray` if it is not
    running. The defaults (one executor with one core and 1 GB) fit a 2-core
    machine next to a replicated query.

    >>> spark = spark_session(configs={"spark.sql.shuffle.partitions": "8"})   # doctest: +SKIP
    >>> spark.read.parquet("readings/").count()                               # doctest: +SKIP
    """
    global _session
    with _lock:
        if _session is not None and _session.sparkContext._jsc is not None:
            return _session
        java_version()
        try:
            import raydp
        except ImportError as e:  # pragma: no cover - raydp is a dependency
            raise SparkUnavailable(f"RayDP is not installed ({e}); `pip install raydp==1.6.5`") from e
        import ray

        from ..engines.ray.deployment import init_ray

        if not ray.is_initialized():
            init_ray()
        merged = dict(DEFAULT_CONFIGS)
        # set while the driver's JVM starts (it inherits them): the Ray client inside it logs at INFO
        # by default (gcs_client.cc lines on stderr)
        jvm_env = {"RAY_BACKEND_LOG_LEVEL": "error"}
        # Spark's Python workers run this interpreter, not the first python3 on PATH (which may lack
        # replistream: an unactivated virtual environment, cron, an IDE). PySpark takes the workers'
        # interpreter from PYSPARK_PYTHON when the SparkContext starts (the spark.pyspark.python
        # option only reaches spark-submit), so the choice is made there: the configs' option, else
        # PYSPARK_PYTHON as the user set it, else this interpreter.
        python = (configs or {}).get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or sys.executable
        os.environ["PYSPARK_PYTHON"] = python
        merged["spark.pyspark.python"] = merged["spark.pyspark.driver.python"] = python
        if ray.util.get_node_ip_address() in ("127.0.0.1", "::1"):  # a local Ray on loopback: Spark too
            merged["spark.driver.bindAddress"] = merged["spark.driver.host"] = "127.0.0.1"
            jvm_env["SPARK_LOCAL_IP"] = "127.0.0.1"  # nor does it look for another address
        merged.update(configs or {})
        saved = {name: os.environ.get(name) for name in jvm_env}
        os.environ.update({name: value for name, value in jvm_env.items() if saved[name] is None})
        try:
            _session = raydp.init_spark(app_name=app_name, num_executors=num_executors,
                                        executor_cores=executor_cores, executor_memory=executor_memory,
                                        configs=merged)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
        _session.sparkContext.setLogLevel("ERROR")
        return _session


def active_session():
    """The session :func:`spark_session` started, or ``None``."""
    if _session is not None and _session.sparkContext._jsc is not None:
        return _session
    return None


def stop_spark() -> None:
    """Stop the Spark session started by :func:`spark_session` (no-op if none)."""
    global _session
    with _lock:
        if _session is None:
            return
        import raydp

        try:
            raydp.stop_spark()
        finally:
            _session = None
