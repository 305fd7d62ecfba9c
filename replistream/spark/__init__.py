"""Spark through RayDP: feed replicated queries from Spark DataFrames and get results back as DataFrames.

- :func:`spark_session` starts (or reuses) Spark on Ray with the JVM options
  Java 17 needs; :func:`java_version` checks Java first.
- :class:`SparkSource` replays a batch DataFrame (Parquet, CSV, JSON, a
  table) into a source; :class:`SparkStreamSource` feeds a Structured
  Streaming DataFrame micro-batch by micro-batch, with punctuations following
  Spark's event-time watermark.
- :func:`to_spark` and :class:`SparkSink` turn application results into Spark
  DataFrames (and Parquet).

Rows move Spark -> RayDP -> Ray's object store -> the entry points, never
through the driver.

>>> from replistream.spark import SparkSource, spark_session   # doctest: +SKIP
>>> spark = spark_session()                                      # doctest: +SKIP
>>> src = SparkSource(spark.read.parquet("loads/"), time="event_time")   # doctest: +SKIP
"""
from .convert import ConversionPlan, convert_table
from .session import JAVA_OPTIONS, SparkUnavailable, active_session, java_version, spark_session, stop_spark
from .sink import SparkSink, to_arrow, to_spark
from .source import SparkSource, SparkSourceError, SparkStreamSource, parse_interval, spark_watermark

__all__ = ["spark_session", "stop_spark", "active_session", "java_version", "SparkUnavailable", "JAVA_OPTIONS",
           "SparkSource", "SparkSourceError", "SparkStreamSource", "SparkSink", "to_spark", "to_arrow", "convert_table",
           "ConversionPlan", "parse_interval", "spark_watermark"]
