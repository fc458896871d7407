"""The peer side: what the controller runs on a peer over SSH (report, probe, run) and the wire format.

Standard library only; this package and the other shipped ones make up the bundle.
"""
