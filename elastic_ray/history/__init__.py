"""A run's history, read back from its event log: what ran where and when, and what it cost.

``runs`` turns the events into allocations, node intervals, head periods,
elections and payload runs; ``usage`` adds up node- and GPU-hours from
them; ``timeline`` draws them (with matplotlib, the ``timeline`` extra) and
``page`` lays the drawing and the tables out as one HTML page; ``summary``
is the handful of figures a Dagster step reports. All but ``timeline``
(and ``summary``'s reader) are pure, so a damaged or partly lost log is
tested by table.
"""
