"""Discrete-event simulation of planned steps on modelled clusters, and the compared systems (docs/simulator.md)."""
