"""The contract on the wire: signed control frames over ZeroMQ.

``frames`` (the envelope, its HMAC tag and the per-kind schemas), ``channel``
(the control server and client), ``curve`` (CURVE keys), ``sockets`` (socket
options and binding), ``link_watch`` (a dropped connection) and
``head_status`` (how both sides read a head agent's ``status`` answer).
"""
