"""Limits shared by everything that reads logs: collectors cut lines with them, detectors match within them."""

# A log line longer than this is cut before matching, so one 100 MB line costs what a 64 KB one does.
MAX_LINE_CHARS = 64 * 1024
# A line kept for matching is cut at this many bytes while reading: UTF-8 needs at most 4 bytes a
# character, so a cut line still decodes to more than MAX_LINE_CHARS characters and is reported as cut.
MAX_LINE_BYTES = 4 * MAX_LINE_CHARS + 4
