"""The SCRAM server against the RFC 7677 test vector, and its refusals."""

from __future__ import annotations

import base64

import pytest

from antdt.embedded import scram
from antdt.embedded.scram import ScramFailure, ScramServerExchange, make_credential

# RFC 7677 section 3: user "user", password "pencil".
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


@pytest.fixture
def rfc_exchange(monkeypatch) -> ScramServerExchange:
    monkeypatch.setattr(scram.secrets, "token_urlsafe", lambda _n: SERVER_NONCE)
    credential = make_credential(
        "SCRAM-SHA-256", "pencil", 4096, salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    )
    return ScramServerExchange("SCRAM-SHA-256", {"user": credential}.get, b"k" * 32)


def test_rfc_7677_exchange(rfc_exchange):
    assert rfc_exchange.first(CLIENT_FIRST) == SERVER_FIRST
    assert rfc_exchange.final(CLIENT_FINAL) == SERVER_FINAL
    assert rfc_exchange.username == "user"


def test_a_wrong_proof_is_refused(rfc_exchange):
    rfc_exchange.first(CLIENT_FIRST)
    wrong = CLIENT_FINAL[:-6] + b"AAAAA="
    with pytest.raises(ScramFailure, match="invalid credentials for user 'user'"):
        rfc_exchange.final(wrong)


def test_a_replayed_final_message_with_another_nonce_is_refused(rfc_exchange, monkeypatch):
    monkeypatch.setattr(scram.secrets, "token_urlsafe", lambda _n: "another-nonce")
    rfc_exchange.first(CLIENT_FIRST)
    with pytest.raises(ScramFailure, match="wrong nonce"):
        rfc_exchange.final(CLIENT_FINAL)


def test_an_unknown_user_gets_a_stable_salt_and_the_same_refusal():
    def salt_for(name: str) -> bytes:
        exchange = ScramServerExchange("SCRAM-SHA-512", {}.get, b"k" * 32)
        first = dict(
            part.split("=", 1)
            for part in exchange.first(f"n,,n={name},r=abc".encode()).decode().split(",")
        )
        return first["s"]

    assert salt_for("mallory") == salt_for("mallory") != salt_for("eve")
    exchange = ScramServerExchange("SCRAM-SHA-512", {}.get, b"k" * 32)
    nonce = dict(
        p.split("=", 1) for p in exchange.first(b"n,,n=mallory,r=abc").decode().split(",")
    )["r"]
    with pytest.raises(ScramFailure, match="invalid credentials for user 'mallory'"):
        exchange.final(f"c=biws,r={nonce},p={base64.b64encode(bytes(64)).decode()}".encode())


@pytest.mark.parametrize("client_first", [b"p=tls-unique,,n=user,r=x", b"n,,r=x", b"garbage"])
def test_malformed_or_channel_bound_first_messages_are_refused(client_first):
    with pytest.raises(ScramFailure):
        ScramServerExchange("SCRAM-SHA-256", {}.get, b"k" * 32).first(client_first)
