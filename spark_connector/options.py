"""Which options the ``leasefs`` data source takes, checked before any work is planned:
none is silently ignored.

Why it exists: Spark's own file sources honour options such as ``mergeSchema``,
``pathGlobFilter``, ``lineSep`` or ``compression``; accepted here and ignored, they gave
wrong results without an error (a dropped column, files read that should not be, plain files
where gzip was asked for). So each option is one of:

1. **supported** for the format and direction (read or write): it works as described in
   ``datasource.py``;
2. **an option Spark's own source honours for this format and direction that this source
   does not implement**: refused up front, naming it and listing what is supported; a
   value that makes it a no-op (Spark's default) is accepted, and so is an option Spark
   honours only for other formats (Spark ignores it here too: the same result);
3. **unknown to Spark's file sources too** (or one of ours that does nothing here): a
   warning, naming the closest supported option (Spark's own sources ignore unknown
   options, and a misspelt one is the usual cause).

Spark lower-cases option keys; names here are compared lower-cased.

Concurrency contract: pure.
"""

from __future__ import annotations

import difflib
import logging

from fs.errors import InvalidArgument

log = logging.getLogger(__name__)

# what this source does, by format and direction (datasource.py describes each)
COMMON = {"format", "path", "paths", "meta"}
READ_COMMON = {"splitsize", "filterpushdown", "pathglobfilter", "recursivefilelookup",
               "modifiedbefore", "modifiedafter", "ignoremissingfiles", "ignorecorruptfiles",
               "partitioncolumntypeinference", "basepath"}
STREAM = {"maxfilespertrigger", "lookbackseconds", "checkpointlocation"}
_TEXT_READ = {"linesep", "mode", "columnnameofcorruptrecord", "dateformat", "timestampformat",
              "samplingratio"}
READ = {
    "text": {"includepath", "wholetext", "linesep"},
    "binaryfile": set(),
    "csv": _TEXT_READ | {"header", "inferschema", "sep", "delimiter", "quote", "escape",
                         "nullvalue", "multiline", "comment", "ignoreleadingwhitespace",
                         "ignoretrailingwhitespace", "nanvalue", "positiveinf", "negativeinf",
                         "emptyvalue"},
    "json": _TEXT_READ | {"primitivesasstring"},
    "parquet": {"mergeschema"},
    "orc": {"mergeschema"},
}
_TEXT_WRITE = {"compression", "codec", "linesep"}
WRITE = {
    "text": _TEXT_WRITE,
    "csv": _TEXT_WRITE | {"header", "sep", "delimiter", "quote", "escape", "escapequotes",
                          "quoteall", "nullvalue", "emptyvalue", "dateformat",
                          "timestampformat", "ignoreleadingwhitespace",
                          "ignoretrailingwhitespace"},
    "json": _TEXT_WRITE | {"dateformat", "timestampformat", "ignorenullfields"},
    "parquet": {"compression"},
    "orc": {"compression"},
}
WRITE_COMMON = {"stalestagingseconds", "partitionby", "partitionoverwritemode",
                "maxopenfiles", "maxrecordsperfile"}

# options Spark's built-in file sources honour, by format and direction (its data source
# option docs): one of these that this source does not take for the same format and
# direction is refused, not ignored. One Spark honours for another format only (``header``
# for parquet) is ignored by Spark too, so it is accepted here: same result.
_GENERIC_READ = {"pathglobfilter", "recursivefilelookup", "modifiedbefore", "modifiedafter",
                 "ignorecorruptfiles", "ignoremissingfiles", "basepath"}
_CSV_READ = {"sep", "delimiter", "encoding", "charset", "quote", "escape", "comment",
             "header", "inferschema", "preferdate", "enforceschema",
             "ignoreleadingwhitespace", "ignoretrailingwhitespace", "nullvalue", "nanvalue",
             "positiveinf", "negativeinf", "dateformat", "timestampformat",
             "timestampntzformat", "enabledatetimeparsingfallback", "maxcolumns",
             "maxcharspercolumn", "mode", "columnnameofcorruptrecord", "multiline", "locale",
             "linesep", "unescapedquotehandling", "samplingratio", "emptyvalue",
             "chartoescapequoteescaping"}
_JSON_READ = {"timezone", "primitivesasstring", "prefersdecimal", "allowcomments",
              "allowunquotedfieldnames", "allowsinglequotes", "allownumericleadingzeros",
              "allowbackslashescapingofanycharacter", "mode", "columnnameofcorruptrecord",
              "dateformat", "timestampformat", "timestampntzformat",
              "enabledatetimeparsingfallback", "multiline", "allowunquotedcontrolchars",
              "encoding", "linesep", "samplingratio", "dropfieldifallnull", "locale",
              "allownonnumericnumbers"}
SPARK_READ = {
    "text": _GENERIC_READ | {"wholetext", "linesep"},
    "binaryfile": _GENERIC_READ,
    "csv": _GENERIC_READ | _CSV_READ,
    "json": _GENERIC_READ | _JSON_READ,
    "parquet": _GENERIC_READ | {"mergeschema", "datetimerebasemode", "int96rebasemode"},
    "orc": _GENERIC_READ | {"mergeschema"},
}
SPARK_WRITE = {
    "text": {"compression", "linesep"},
    "csv": {"sep", "delimiter", "quote", "escape", "escapequotes", "quoteall", "header",
            "nullvalue", "emptyvalue", "encoding", "charset", "compression", "dateformat",
            "timestampformat", "timestampntzformat", "ignoreleadingwhitespace",
            "ignoretrailingwhitespace", "linesep", "chartoescapequoteescaping", "timezone"},
    "json": {"compression", "dateformat", "timestampformat", "timestampntzformat",
             "encoding", "linesep", "ignorenullfields", "timezone"},
    "parquet": {"compression"},
    "orc": {"compression"},
}
# every option name some Spark file source knows (an unknown one gets a warning)
SPARK_FILE_OPTIONS = set().union(*SPARK_READ.values(), *SPARK_WRITE.values(),
                                 {"codec", "maxrecordsperfile", "partitionby"})

# values with which a Spark option changes nothing here (its default, or what this source
# already does), so they are accepted
NEUTRAL = {
    "mergeschema": {"false"},
    "recursivefilelookup": {"false"},
    "ignorecorruptfiles": {"false"},
    "ignoremissingfiles": {"false"},
    "encoding": {"utf-8", "utf8"},
    "charset": {"utf-8", "utf8"},
    "compression": {"none", "uncompressed"},
    "codec": {"none", "uncompressed"},
    "linesep": {"\n", "\\n"},
    "wholetext": {"false"},
    "multiline": {"false"},      # json: one record per line is what this source reads
    # pyarrow reads dates and timestamps in the proleptic Gregorian calendar: CORRECTED
    "datetimerebasemode": {"corrected"},
    "int96rebasemode": {"corrected"},
    "timezone": {"utc", "z", "+00:00", "gmt", "etc/utc"},   # timestamps are read and written in UTC
}


def supported(fmt: str, direction: str, streaming: bool = False) -> set[str]:
    """The option names ``fmt`` takes when read (``"read"``) or written (``"write"``)."""
    table = READ if direction == "read" else WRITE
    names = COMMON | table.get(fmt, set())
    names |= WRITE_COMMON if direction == "write" else READ_COMMON
    if streaming:
        names |= STREAM
    return names


def check(options, fmt: str, direction: str, *, streaming: bool = False) -> list[str]:
    """Refuse (``InvalidArgument``) a Spark file-source option this source does not take for
    ``fmt`` and ``direction``; return warnings for options no Spark file source knows (each
    also logged)."""
    names = supported(fmt, direction, streaming)
    every_supported = set(COMMON) | READ_COMMON | STREAM | WRITE_COMMON
    for table in (READ, WRITE):
        for extra in table.values():
            every_supported |= extra
    honoured = (SPARK_READ if direction == "read" else SPARK_WRITE).get(fmt, set())
    refused, warnings = [], []
    for key, value in (options or {}).items():
        name = str(key).lower()
        if name in names:
            continue
        if name in NEUTRAL and str(value).strip().lower() in NEUTRAL[name]:
            continue
        if name in honoured:
            refused.append(name)
            continue
        if name in SPARK_FILE_OPTIONS:
            continue         # Spark ignores it for this format too: the same result
        if name in every_supported:
            text = (f"leasefs data source: option {key!r} does nothing when "
                    f"{'reading' if direction == 'read' else 'writing'} {fmt}; ignored")
        else:
            close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
            text = (f"leasefs data source: unknown option {key!r} ignored"
                    + (f" (did you mean {close[0]!r}?)" if close else ""))
        log.warning("%s", text)
        warnings.append(text)
    if refused:
        raise InvalidArgument(
            f"leasefs data source: option(s) {', '.join(sorted(refused))} not supported when "
            f"{'reading' if direction == 'read' else 'writing'} format {fmt!r} (Spark's own "
            f"sources take them; here they would be ignored and give other results); "
            f"supported: {', '.join(sorted(names))}")
    return warnings


__all__ = ["check", "supported", "SPARK_READ", "SPARK_WRITE", "SPARK_FILE_OPTIONS"]
