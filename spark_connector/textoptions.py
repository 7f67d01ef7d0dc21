"""The options of the line-based formats (text, csv, json) read once into a frozen
``TextOptions``, and Spark's datetime patterns (``yyyy-MM-dd HH:mm:ss``) translated into
parsing and formatting of Python datetimes.

Why: readers and writers in several modules need the same option values with Spark's
defaults (which differ between reading and writing, e.g. csv whitespace trimming), and a
datetime pattern this source cannot honour must be refused with a clear error before a job
runs, not parsed differently.

Concurrency contract: pure; ``TextOptions`` and ``DatetimePattern`` are immutable.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from fs.errors import InvalidArgument

from .optionvalues import flag, option

MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
DEFAULT_TIMESTAMP = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"
DEFAULT_DATE = "yyyy-MM-dd"
CORRUPT_DEFAULT = "_corrupt_record"

# Spark pattern letter runs → strptime directives (read) ; formatting is done per token
_DIRECTIVES = {"yyyy": "%Y", "uuuu": "%Y", "yy": "%y", "uu": "%y", "MM": "%m", "M": "%m",
               "MMM": "%b", "MMMM": "%B", "LL": "%m", "L": "%m", "dd": "%d", "d": "%d",
               "HH": "%H", "H": "%H", "hh": "%I", "h": "%I", "mm": "%M", "m": "%M",
               "ss": "%S", "s": "%S", "a": "%p", "EEE": "%a", "EEEE": "%A", "E": "%a",
               "XXX": "%z", "XX": "%z", "X": "%z", "xxx": "%z", "xx": "%z", "Z": "%z",
               "ZZ": "%z", "ZZZ": "%z", "DDD": "%j"}
_FRACTION = re.compile(r"S{1,9}$")


@dataclass(frozen=True)
class DatetimePattern:
    """A Spark datetime pattern as tokens: ``("lit", text)`` or ``("field", letters)``."""

    pattern: str
    tokens: tuple

    @classmethod
    def parse(cls, pattern: str, option_name: str) -> "DatetimePattern":
        tokens, i = [], 0
        while i < len(pattern):
            ch = pattern[i]
            if ch == "'":
                end = pattern.find("'", i + 1)
                if end < 0:
                    raise InvalidArgument(f"leasefs data source: {option_name} {pattern!r}: "
                                          f"unterminated quote")
                tokens.append(("lit", pattern[i + 1:end] if end > i + 1 else "'"))
                i = end + 1
            elif ch.isalpha():
                j = i
                while j < len(pattern) and pattern[j] == ch:
                    j += 1
                run = pattern[i:j]
                if run not in _DIRECTIVES and not _FRACTION.match(run):
                    raise InvalidArgument(
                        f"leasefs data source: {option_name} {pattern!r}: pattern letters "
                        f"{run!r} are not supported (supported: y u M L d D H h m s S a E X x "
                        f"Z and quoted 'text')")
                tokens.append(("field", run))
                i = j
            else:
                tokens.append(("lit", ch))
                i += 1
        return cls(pattern, tuple(tokens))

    @property
    def has_fraction(self) -> bool:
        return any(k == "field" and _FRACTION.match(t) for k, t in self.tokens)

    def strptime_format(self) -> str:
        parts = []
        for kind, text in self.tokens:
            if kind == "lit":
                parts.append(text.replace("%", "%%"))
            elif _FRACTION.match(text):
                parts.append("%f")
            else:
                parts.append(_DIRECTIVES[text])
        return "".join(parts)

    def parse_value(self, text: str) -> datetime.datetime | None:
        """The datetime ``text`` means (zone-less: UTC), or ``None`` if it does not match."""
        fmt = self.strptime_format()
        try:
            value = datetime.datetime.strptime(text, fmt)
        except ValueError:
            if self.has_fraction:
                # Spark's S..S takes up to 9 digits; Python's %f at most 6
                cut = re.sub(r"(\.\d{6})\d{1,3}", r"\1", text)
                try:
                    value = datetime.datetime.strptime(cut, fmt)
                except ValueError:
                    return None
            else:
                return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value

    def format_value(self, value) -> str:
        """``value`` (a datetime in UTC, or a date) written with this pattern."""
        out = []
        for kind, text in self.tokens:
            if kind == "lit":
                out.append(text)
                continue
            letter, n = text[0], len(text)
            if letter == "S":
                micros = getattr(value, "microsecond", 0)
                out.append(f"{micros:06d}{'000'}"[:n])
            elif letter in "XxZ":
                off = value.utcoffset() if isinstance(value, datetime.datetime) else None
                secs = int(off.total_seconds()) if off is not None else 0
                if secs == 0 and letter == "X":
                    out.append("Z")
                    continue
                sign, secs = ("-" if secs < 0 else "+"), abs(secs)
                hh, mm = secs // 3600, secs // 60 % 60
                out.append(f"{sign}{hh:02d}:{mm:02d}" if n == 3 else f"{sign}{hh:02d}{mm:02d}"
                           if n == 2 or letter == "Z" else f"{sign}{hh:02d}")
            elif letter in "yu":
                out.append(f"{value.year % 100:02d}" if n == 2 else f"{value.year:0{n}d}")
            elif letter in "dHhmsML" and n <= 2:
                number = {"d": value.day, "M": value.month, "L": value.month}.get(letter)
                if number is None:
                    number = {"H": value.hour, "h": (value.hour % 12) or 12,
                              "m": value.minute, "s": value.second}[letter]
                out.append(f"{number:0{n}d}")
            else:
                out.append(value.strftime(_DIRECTIVES[text]))
        return "".join(out)


def _char_option(options, name: str, default: str | None) -> str | None:
    value = option(options, name, default)
    if value is None:
        return None
    value = "\t" if value == "\\t" else str(value)
    return value


def _line_sep(options, fmt: str, direction: str) -> str | None:
    value = option(options, "lineSep")
    if value is None:
        return None
    value = str(value).replace("\\n", "\n").replace("\\r", "\r").replace("\\t", "\t")
    if not value:
        raise InvalidArgument("leasefs data source: lineSep must not be empty")
    if fmt == "csv" and direction == "read" and len(value) > 1 and value != "\r\n":
        raise InvalidArgument(f"leasefs data source: csv lineSep {value!r}: at most one "
                              f"character (or \\r\\n), as Spark")
    return value


@dataclass(frozen=True)
class TextOptions:
    """Every option of the line-based formats, with Spark's defaults for the direction."""

    fmt: str
    direction: str
    line_sep: str | None            # None: \n, \r\n or \r when reading, \n when writing
    mode: str
    corrupt_column: str
    timestamp: DatetimePattern | None  # None when reading: Spark's lenient default
    date: DatetimePattern | None
    header: bool
    delimiter: str
    quote: str | None
    escape: str | None
    comment: str | None
    null_value: str
    empty_value: str | None
    nan_value: str
    positive_inf: str
    negative_inf: str
    trim_leading: bool
    trim_trailing: bool
    quote_all: bool
    escape_quotes: bool
    wholetext: bool
    primitives_as_string: bool
    ignore_null_fields: bool
    sampling_ratio: float
    multiline: bool                 # csv: records may span lines (Spark: false)

    @classmethod
    def of(cls, options, fmt: str, direction: str) -> "TextOptions":
        writing = direction == "write"
        mode = str(option(options, "mode", "PERMISSIVE")).strip().upper()
        if mode not in MODES:
            raise InvalidArgument(f"leasefs data source: mode {mode!r} is not one of "
                                  f"{', '.join(MODES)}")
        ts = option(options, "timestampFormat", DEFAULT_TIMESTAMP if writing else None)
        date = option(options, "dateFormat", DEFAULT_DATE if writing else None)
        ratio = float(option(options, "samplingRatio", 1.0))
        if not 0 < ratio <= 1:
            raise InvalidArgument(f"leasefs data source: samplingRatio {ratio} is not in "
                                  f"(0, 1]")
        quote = _char_option(options, "quote", '"')
        escape = _char_option(options, "escape", "\\")
        return cls(
            fmt=fmt, direction=direction,
            line_sep=_line_sep(options, fmt, direction),
            mode=mode,
            corrupt_column=str(option(options, "columnNameOfCorruptRecord", CORRUPT_DEFAULT)),
            timestamp=DatetimePattern.parse(ts, "timestampFormat") if ts else None,
            date=DatetimePattern.parse(date, "dateFormat") if date else None,
            header=flag(options, "header", False),
            delimiter=_char_option(options, "delimiter", _char_option(options, "sep", ",")),
            quote=quote or None,
            escape=escape or None,
            comment=_char_option(options, "comment", None) or None,
            null_value=str(option(options, "nullValue", "")),
            empty_value=option(options, "emptyValue", '""' if writing else None),
            nan_value=str(option(options, "nanValue", "NaN")),
            positive_inf=str(option(options, "positiveInf", "Inf")),
            negative_inf=str(option(options, "negativeInf", "-Inf")),
            trim_leading=flag(options, "ignoreLeadingWhiteSpace", writing),
            trim_trailing=flag(options, "ignoreTrailingWhiteSpace", writing),
            quote_all=flag(options, "quoteAll", False),
            escape_quotes=flag(options, "escapeQuotes", True),
            wholetext=flag(options, "wholetext", False),
            primitives_as_string=flag(options, "primitivesAsString", False),
            ignore_null_fields=flag(options, "ignoreNullFields", True),
            sampling_ratio=ratio,
            multiline=flag(options, "multiLine", False),
        )

    @property
    def splittable(self) -> bool:
        """Can files be cut at block boundaries (only with Spark's default line breaks)?"""
        return self.line_sep is None and not self.wholetext


__all__ = ["TextOptions", "DatetimePattern", "MODES", "CORRUPT_DEFAULT"]
