"""Keyword mistakes in the Python API answered as the command line answers them (issue #44).

:func:`checked_keywords` wraps a function so that an unknown keyword argument raises a
``TypeError`` that names it, the nearest keyword the function takes ("did you mean") and every
keyword it takes, instead of Python's bare "got an unexpected keyword argument".

>>> @checked_keywords
... def deploy(query, servers=None, k=2, *, parallelism=1):
...     return k
>>> deploy("q", k=3)
3
>>> deploy("q", paralelism=2)
Traceback (most recent call last):
...
TypeError: deploy() got an unexpected keyword argument 'paralelism'; did you mean 'parallelism'? Its keywords: query, servers, k, parallelism
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable

__all__ = ["checked_keywords", "unknown_keyword"]


def unknown_keyword(func_name: str, word: str, keywords) -> TypeError:
    """The ``TypeError`` for keyword ``word`` that ``func_name`` does not take.

    >>> unknown_keyword("wait", "timout", ["timeout", "progress"])
    TypeError("wait() got an unexpected keyword argument 'timout'; did you mean 'timeout'? Its keywords: timeout, progress")
    """
    from .query import did_you_mean

    keywords = list(keywords)
    return TypeError(f"{func_name}() got an unexpected keyword argument {word!r}{did_you_mean(word, keywords) or '.'} "
                     f"Its keywords: {', '.join(keywords)}")


def checked_keywords(fn: Callable) -> Callable:
    """``fn``, answering an unknown keyword argument with :func:`unknown_keyword` before it runs
    (a function that takes ``**kwargs`` is returned as it is: every keyword is known to it)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn
    keywords = [p.name for p in params
                if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    known = set(keywords)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for word in kwargs:
            if word not in known:
                raise unknown_keyword(fn.__name__, word, keywords) from None
        return fn(*args, **kwargs)

    return wrapper
