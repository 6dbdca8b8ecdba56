"""The foundation every layer may use: local file changes (the one fault hook and atomic writes), the
file-access protocol, numpy byte views, pausing the garbage collector around per-record loops, lazy
package exports, queue hand-off and start-up helpers.

Imports nothing of tfrbeam but ``tfrbeam.errors``; never Apache Beam.
"""
