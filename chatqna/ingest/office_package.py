"""The checks an Office file (a zip of XML parts) passes before a parser unpacks any of it.

`open_package` checks that it is a zip at all (a password-protected Office file is an OLE
compound file instead), that its parts' declared sizes add up to at most
`LoadLimits.max_unpacked_bytes`, that no XML part declares more than
`LoadLimits.max_xml_part_bytes` and that those parts together declare at most
`LoadLimits.max_parsed_xml_bytes` (the parsers build a tree of each part in memory, many
times its size, and python-docx and python-pptx build one of every part they reach when
they open a file, headers and footers as much as the main document; a spreadsheet's
sheets and strings, read as a stream, are bounded by the total alone): Python's zip
reader never inflates a part beyond its declared size, so those bounds hold for a zip
bomb too. A part is XML by the content type `[Content_Types].xml`
gives it, as the parsers find parts by relationship and content type, not by name
(`word/document.bin` can be the main document); a name ending `.xml` or `.rels` counts as
XML too, as some parts are opened by their fixed name whatever they are declared as.

A spreadsheet part is exempt from the part bound and the parts' total by its content type
(a worksheet, the shared strings) only while openpyxl has no other way to reach it: one
opened by name, or the target of any relationship but a worksheet's or the shared
strings' (a chartsheet, a drawing, an external link, which openpyxl parses whole) is
bounded like any other. Every
other bound, the `.rels` parts' own among them, is checked before any relationship is read.
"""

from __future__ import annotations

import io
import posixpath
import zipfile
from collections.abc import Iterator

from lxml import etree

from chatqna.errors import DocumentLoadError, PayloadTooLarge
from chatqna.ingest.tables import LoadLimits

__all__ = ["XLSX_STREAMED", "open_package"]

# The signature of an OLE2 compound file: what an encrypted .docx/.pptx/.xlsx (and the
# legacy .doc/.ppt/.xls formats) are stored as.
_OLE_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_ENCRYPTION_STREAM = "EncryptionInfo".encode("utf-16-le")
_CONTENT_TYPES = "[Content_Types].xml"
_CONTENT_TYPES_NS = "{http://schemas.openxmlformats.org/package/2006/content-types}"
# No DTD, no entity expansion, no network: the content types are read before any bound
# but their own size is known to hold.
_SAFE_XML = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
# Named parts parsed as XML whatever their content type says (images and other media are
# not parsed, so not bounded alone).
_XML_SUFFIXES = (".xml", ".rels")
_SPREADSHEET = "application/vnd.openxmlformats-officedocument.spreadsheetml."
# What openpyxl's read-only mode parses as a stream of rows or strings, never as one tree,
# by content type (ECMA-376 Part 1, 12.3.24 and 12.3.15), lowercased: media types compare
# case-insensitively, and `_PartTypes` gives them lowercased.
XLSX_STREAMED = frozenset(
    content_type.lower()
    for content_type in (_SPREADSHEET + "worksheet+xml", _SPREADSHEET + "sharedStrings+xml")
)
# The parts openpyxl opens by name and parses whole, however they are declared.
_XLSX_READ_BY_NAME = frozenset(
    {"xl/workbook.xml", "xl/styles.xml", "docprops/core.xml", "docprops/custom.xml"}
)
_RELATIONSHIP = "{http://schemas.openxmlformats.org/package/2006/relationships}Relationship"
# The relationships openpyxl reads the target of as a stream: a workbook's worksheets and
# shared strings (in the transitional and the strict namespace).
_STREAMED_RELATIONSHIPS = frozenset(
    namespace + kind
    for namespace in (
        "http://schemas.openxmlformats.org/officeDocument/2006/relationships/",
        "http://purl.oclc.org/ooxml/officeDocument/relationships/",
    )
    for kind in ("worksheet", "sharedStrings")
)


class _PartTypes:
    """The content type of each part of a package, as `[Content_Types].xml` gives them:
    an `Override` by part name, else a `Default` by extension (ECMA-376 Part 2, 10.1.2).
    Names and extensions compare case-insensitively, as OPC part names do."""

    def __init__(self, source: str, xml: bytes) -> None:
        try:
            root = etree.fromstring(xml, _SAFE_XML)
        except etree.XMLSyntaxError as exc:
            raise DocumentLoadError(
                f"{source} is not a readable Office file ({_CONTENT_TYPES}: {exc})",
                reason="corrupt",
            ) from exc
        self.defaults: dict[str, str] = {}
        self.overrides: dict[str, str] = {}
        for entry in root:
            content_type = entry.get("ContentType")
            if content_type is None:
                continue
            if entry.tag == _CONTENT_TYPES_NS + "Default" and entry.get("Extension"):
                self.defaults[entry.get("Extension").lower()] = content_type.lower()
            elif entry.tag == _CONTENT_TYPES_NS + "Override" and entry.get("PartName"):
                name = entry.get("PartName").lstrip("/").lower()
                self.overrides[name] = content_type.lower()

    def of(self, name: str) -> str | None:
        """The content type of the zip entry `name` (lowercased), None when none is given."""
        name = name.lower()
        if name in self.overrides:
            return self.overrides[name]
        _, dot, extension = name.rpartition("/")[2].rpartition(".")
        return self.defaults.get(extension) if dot else None


def _is_xml(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip()
    return media_type.endswith(("/xml", "+xml"))


def _read_part_types(source: str, archive: zipfile.ZipFile, limits: LoadLimits) -> _PartTypes:
    try:
        info = archive.getinfo(_CONTENT_TYPES)
    except KeyError:
        raise DocumentLoadError(
            f"{source} is not a readable Office file (it has no {_CONTENT_TYPES})",
            reason="corrupt",
        ) from None
    _check_xml_part(source, info, limits)
    return _PartTypes(source, archive.read(info))


def _check_xml_part(source: str, info: zipfile.ZipInfo, limits: LoadLimits) -> None:
    if info.file_size > limits.max_xml_part_bytes:
        raise PayloadTooLarge(
            f"{source}: its part {info.filename} unpacks to {info.file_size} bytes of "
            f"XML, more than the {limits.max_xml_part_bytes} one part may; split the "
            "file into smaller ones",
            details={"source": source, "part": info.filename, "bytes": info.file_size},
        )


def _relationships(source: str, archive: zipfile.ZipFile, rels: str) -> Iterator[tuple[str, str]]:
    """`(type, target part, lowercased)` of each internal relationship in the part `rels`,
    read as a stream; a relative target is resolved against the folder of the part the
    relationships belong to, the folder above `_rels/` (ECMA-376 Part 2, 9.3), as
    openpyxl resolves it."""
    parent = posixpath.dirname(posixpath.dirname(rels))
    try:
        with archive.open(rels) as stream:
            for _, element in etree.iterparse(
                stream, tag=_RELATIONSHIP, resolve_entities=False, no_network=True, load_dtd=False
            ):
                kind, target = element.get("Type", ""), element.get("Target", "")
                external = element.get("TargetMode") == "External"
                element.clear()
                while element.getprevious() is not None:  # keep the tree one element deep
                    del element.getparent()[0]
                if not external:
                    path = target[1:] if target.startswith("/") else posixpath.join(parent, target)
                    yield kind, posixpath.normpath(path).lower()
    except etree.XMLSyntaxError as exc:
        raise DocumentLoadError(
            f"{source} is not a readable Office file ({rels}: {exc})", reason="corrupt"
        ) from exc


def _reached_otherwise(source: str, archive: zipfile.ZipFile) -> frozenset[str]:
    """The parts (lowercased) a relationship of a type not in `_STREAMED_RELATIONSHIPS`
    leads to, from any part of the package: those a parser may read whole."""
    return frozenset(
        target
        for name in archive.namelist()
        if name.lower().endswith(".rels")
        for kind, target in _relationships(source, archive, name)
        if kind not in _STREAMED_RELATIONSHIPS
    )


def _parsed_whole(
    info: zipfile.ZipInfo, types: _PartTypes, streamed: frozenset[str], reached: frozenset[str]
) -> bool:
    """Whether a parser may build a tree of the whole part: any XML part but those of a
    `streamed` content type, unless the parser also opens it by name or is led to it by
    a relationship (in `reached`) as something else."""
    name = info.filename.lower()
    content_type = types.of(name)
    if content_type is not None and content_type in streamed:
        return name.endswith(".rels") or name in _XLSX_READ_BY_NAME or name in reached
    return name.endswith(_XML_SUFFIXES) or (content_type is not None and _is_xml(content_type))


def open_package(
    source: str, data: bytes, limits: LoadLimits, streamed: frozenset[str] = frozenset()
) -> None:
    """Refuse what is not a sane Office zip before a parser unpacks anything; the parts
    of a content type in `streamed` are read a piece at a time (not as one tree), so they
    are bounded by `max_unpacked_bytes` alone, unless a relationship of another kind leads
    to them."""
    streamed = frozenset(content_type.lower() for content_type in streamed)
    if data.startswith(_OLE_SIGNATURE):
        if _ENCRYPTION_STREAM in data:
            raise DocumentLoadError(
                f"{source} is password-protected; save a copy without a password and upload that",
                reason="encrypted",
            )
        raise DocumentLoadError(
            f"{source} is a legacy binary Office file; save it as .docx, .pptx or .xlsx",
            reason="legacy_format",
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            parts = archive.infolist()
            declared = sum(info.file_size for info in parts)
            if declared > limits.max_unpacked_bytes:
                raise PayloadTooLarge(
                    f"{source} unpacks to {declared} bytes, more than "
                    f"{limits.max_unpacked_bytes} (CHATQNA_DATAPREP_MAX_UNPACKED_BYTES)",
                    details={"source": source, "unpacked_bytes": declared},
                )
            types = _read_part_types(source, archive, limits)
            # Every bound that does not hang on the relationships first, the `.rels` parts'
            # own among them: the relationships are read only once their parts are bounded.
            _check_parts(source, parts, types, streamed, frozenset(), limits)
            if streamed:
                reached = _reached_otherwise(source, archive)
                _check_parts(source, parts, types, streamed, reached, limits)
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DocumentLoadError(
            f"{source} is not a readable Office file (not a valid zip: {exc})", reason="corrupt"
        ) from exc


def _check_parts(
    source: str,
    parts: list[zipfile.ZipInfo],
    types: _PartTypes,
    streamed: frozenset[str],
    reached: frozenset[str],
    limits: LoadLimits,
) -> None:
    parsed = 0
    for info in parts:
        if _parsed_whole(info, types, streamed, reached):
            _check_xml_part(source, info, limits)
            parsed += info.file_size
    if parsed > limits.max_parsed_xml_bytes:
        raise PayloadTooLarge(
            f"{source}: its XML parts unpack to {parsed} bytes together, more than the "
            f"{limits.max_parsed_xml_bytes} one file's may (each is parsed whole, into many "
            "times its size in memory); split the file into smaller ones",
            details={"source": source, "xml_bytes": parsed},
        )
