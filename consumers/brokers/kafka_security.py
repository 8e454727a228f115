"""Secured listeners for the local Apache Kafka (consumers/brokers/kafka.py): SASL_SSL
with SCRAM-SHA-512 users, TLS from a PEM key and certificate the caller made, and
StandardAuthorizer ACLs, as a managed or self-run production cluster has them.

    security = KafkaSecurity(keystore=Path("broker.pem"), ca=Path("ca.pem"))
    with KafkaBroker(security=security) as kafka:
        kafka.add_scram_user("worker", "s3cret")
        kafka.allow("User:worker", [Acl("TOPIC", "requests", "READ"), ...])
        ... kafka.secure_bootstrap_servers ...

Two more listeners on request, on the same node (one JVM: tests stay cheap on 2 cores):

- MTLS (`client_ca=`): SSL with `ssl.client.auth=required`; a client shows a
  certificate signed by `client_ca`, and its principal is the certificate's subject as
  Kafka's DEFAULT `ssl.principal.mapping.rules` write it, `User:CN=worker`, unless
  `principal_mapping_rules` map it to another name first.
- OAUTH (`oauthbearer=True`): SASL_SSL with OAUTHBEARER, checked by Kafka's own
  unsecured-JWS validator (OAuthBearerUnsecuredValidatorCallbackHandler, the default
  when no sasl.server.callback.handler.class is set; for tests only: tokens carry no
  signature). A token's `sub` is its principal (`User:worker`), and it must carry the
  scope OAUTH_SCOPE.

    kafka.listener_bootstrap(MTLS_LISTENER)   # the addresses of one listener

The PLAINTEXT listener stays, for the nodes' own traffic (inter-broker and controller)
and for the harness itself: its principal, User:ANONYMOUS, is a super user, so topic
creation, users and ACLs go through it. Clients under test use the secured listeners
only, where nothing is allowed that an ACL does not grant (allow.everyone.if.no.acl.found
false, Kafka's default).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from consumers.brokers.embedded import BrokerError
from consumers.profiles import admin_config

SECURE_LISTENER = "SASL_SSL"
MECHANISM = "SCRAM-SHA-512"
MTLS_LISTENER = "MTLS"
OAUTH_LISTENER = "OAUTH"
OAUTH_MECHANISM = "OAUTHBEARER"
# The scope the broker requires of every OAUTHBEARER token (unsecuredValidatorRequiredScope).
OAUTH_SCOPE = "kafka"
# Kafka's minimum for SCRAM-SHA-512; more only slows every login of a test.
SCRAM_ITERATIONS = 4096
_POLL_S = 0.1


@dataclass(frozen=True)
class KafkaSecurity:
    """The broker's TLS identity: `keystore`, one PEM file with its private key (PKCS#8,
    not encrypted) followed by its certificate chain (Kafka's PEM keystore, KIP-651);
    `ca`, the certificate its clients trust (their ssl.ca.location)."""

    keystore: Path
    ca: Path
    client_ca: Path | None = None  # adds the MTLS listener, trusting client certificates of this CA
    # The MTLS listener's ssl.principal.mapping.rules: certificate subject → principal name.
    principal_mapping_rules: str = "DEFAULT"
    oauthbearer: bool = False  # adds the OAUTH listener


def listener_protocols(security: KafkaSecurity) -> dict[str, str]:
    """The secured listeners of a node, name → security protocol."""
    listeners = {SECURE_LISTENER: "SASL_SSL"}
    if security.client_ca is not None:
        listeners[MTLS_LISTENER] = "SSL"
    if security.oauthbearer:
        listeners[OAUTH_LISTENER] = "SASL_SSL"
    return listeners


@dataclass(frozen=True)
class Acl:
    """One ALLOW rule: `operation` on the resource `resource_type` `name`. pattern
    LITERAL matches the name alone, PREFIXED every name starting with it."""

    resource_type: str  # TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID
    name: str
    operation: str  # READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS, CREATE, ...
    pattern: str = "LITERAL"


def server_settings(security: KafkaSecurity) -> dict[str, str]:
    """What a node's server.properties gains for the secured listeners, besides the
    listeners themselves (kafka.py's server_properties adds those). Settings under
    `listener.name.<name>.` hold for that listener alone and override the plain ones
    (the keystore is shared)."""
    settings = {
        "sasl.enabled.mechanisms": MECHANISM,
        f"listener.name.{SECURE_LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(security.keystore),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        # The nodes' own PLAINTEXT and CONTROLLER traffic, and the harness (module doc).
        "super.users": "User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    }
    if security.client_ca is not None:
        mtls = f"listener.name.{MTLS_LISTENER.lower()}"
        settings.update({
            # "required", not "requested": a client without a certificate would be
            # User:ANONYMOUS, this broker's super user (the harness's principal).
            f"{mtls}.ssl.client.auth": "required",
            f"{mtls}.ssl.truststore.type": "PEM",
            f"{mtls}.ssl.truststore.location": str(security.client_ca),
            # DEFAULT: the subject's RFC 2253 form ("CN=worker") is the principal's name.
            f"{mtls}.ssl.principal.mapping.rules": security.principal_mapping_rules,
        })
    if security.oauthbearer:
        oauth = f"listener.name.{OAUTH_LISTENER.lower()}"
        settings.update({
            f"{oauth}.sasl.enabled.mechanisms": OAUTH_MECHANISM,
            # unsecuredLoginStringClaim_sub: the broker's own token, were it ever a client
            # of this listener (it is not: inter-broker traffic is PLAINTEXT).
            f"{oauth}.{OAUTH_MECHANISM.lower()}.sasl.jaas.config":
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                f'unsecuredLoginStringClaim_sub="broker" unsecuredValidatorRequiredScope="{OAUTH_SCOPE}";',
        })
    return settings


def client_settings(username: str, password: str, ca_location: Path | str) -> dict[str, str]:
    """librdkafka settings for a client of the SASL_SSL listener."""
    return {
        "security.protocol": SECURE_LISTENER,
        "sasl.mechanism": MECHANISM,
        "sasl.username": username,
        "sasl.password": password,
        "ssl.ca.location": str(ca_location),
    }


def mtls_client_settings(
    certificate: Path | str, ca_location: Path | str, *, key_pem: str | None = None, key_location: Path | str | None = None
) -> dict[str, str]:
    """librdkafka settings for a client of the MTLS listener: its certificate from a
    file, its private key inline (`key_pem`, ssl.key.pem) or from a file (`key_location`)."""
    if (key_pem is None) == (key_location is None):
        raise ValueError("give the client key as exactly one of key_pem and key_location")
    key = {"ssl.key.pem": key_pem} if key_pem is not None else {"ssl.key.location": str(key_location)}
    return {
        "security.protocol": "SSL",
        "ssl.certificate.location": str(certificate),
        **key,
        "ssl.ca.location": str(ca_location),
    }


def oauthbearer_client_settings(principal: str, ca_location: Path | str, scope: str = OAUTH_SCOPE) -> dict[str, str]:
    """librdkafka settings for a client of the OAUTH listener: librdkafka makes its own
    unsecured token (no signature) with `sub` = principal and the scope given."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": OAUTH_MECHANISM,
        "enable.sasl.oauthbearer.unsecure.jwt": "true",
        "sasl.oauthbearer.config": f"principal={principal} scope={scope}",
        "ssl.ca.location": str(ca_location),
    }


def add_scram_user(bootstrap: str, username: str, password: str, timeout: float = 30.0) -> None:
    """Create (or change the password of) a SCRAM-SHA-512 user, through the PLAINTEXT
    listener at `bootstrap`; returns once the cluster lists the credential."""
    client = AdminClient(admin_config(bootstrap))
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    upsert = UserScramCredentialUpsertion(username, info, password.encode())
    try:
        for future in client.alter_user_scram_credentials([upsert], request_timeout=timeout).values():
            future.result()
    except KafkaException as exc:
        raise BrokerError(f"cannot create SCRAM user {username!r}: {exc.args[0]}") from None
    deadline = time.monotonic() + timeout
    while True:  # the credential reaches the brokers through the metadata log
        try:
            described = client.describe_user_scram_credentials([username], request_timeout=timeout)
            if described[username].result().scram_credential_infos:
                return
        except KafkaException:
            pass
        if time.monotonic() >= deadline:
            raise BrokerError(f"SCRAM user {username!r} not listed within {timeout:g} s")
        time.sleep(_POLL_S)


# Kafka's CLUSTER resource (type 4) is librdkafka's BROKER (RD_KAFKA_RESOURCE_BROKER = 4);
# kafka-acls.sh and the docs say CLUSTER.
_RESOURCE_TYPES = {"CLUSTER": ResourceType.BROKER}


def allow(bootstrap: str, principal: str, acls: Sequence[Acl], timeout: float = 30.0) -> None:
    """Grant `principal` (e.g. "User:worker") every rule of `acls`, from any host."""
    if not acls:
        return
    bindings = [
        AclBinding(
            _RESOURCE_TYPES.get(a.resource_type) or ResourceType[a.resource_type], a.name, ResourcePatternType[a.pattern],
            principal, "*", AclOperation[a.operation], AclPermissionType.ALLOW,
        )
        for a in acls
    ]
    client = AdminClient(admin_config(bootstrap))
    try:
        for future in client.create_acls(bindings, request_timeout=timeout).values():
            future.result()
    except KafkaException as exc:
        raise BrokerError(f"cannot create ACLs for {principal}: {exc.args[0]}") from None
