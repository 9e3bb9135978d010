"""Contracts: Avro schemas (``avro/*.avsc``), the models that mirror them, and the codec.

``avro/`` holds the current schemas, ``released/`` the last released copy of
each, against which every change must stay BACKWARD compatible.
"""
