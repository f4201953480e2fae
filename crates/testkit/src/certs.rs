//! Throw-away test certificates (P-256, self-signed, for tests only) and a helper that writes
//! one to a file: the TLS tests of the client and the processor read them from here.

use std::io::Write;
use std::path::PathBuf;

/// A throw-away self-signed CA certificate (P-256), for tests only.
pub const TEST_CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBiTCCAS+gAwIBAgIUFPzmfXEKit5mdvOOoS8+SwszNLkwCgYIKoZIzj0EAwIw
GTEXMBUGA1UEAwwOaW5mZXJxLXRlc3QtY2EwIBcNMjYxMTI5MDc0ODMyWhgPMjEy
NjExMDUwNzQ4MzJaMBkxFzAVBgNVBAMMDmluZmVycS10ZXN0LWNhMFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAEVrCUbovShPOw+V9hVFq8V+Cae+UhKvXiUbe4iobs
PjLTIasrl+mUeg1sUsZsY0Prp5j5RGb5LbSzyBuuwW5096NTMFEwHQYDVR0OBBYE
FEhQqubYzY0KPy47X8o6Kq/nbAbUMB8GA1UdIwQYMBaAFEhQqubYzY0KPy47X8o6
Kq/nbAbUMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIhAPlvTchO
vYIRRKdhLqLnZlquekLBAsUGa+n4DWehIuzXAiARUoVoHfEQeidvLS2d+Mj1zn5b
s32DDHLfhISpNusvgA==
-----END CERTIFICATE-----
";

/// A throw-away self-signed client certificate and its key (P-256), for tests only.
pub const TEST_CLIENT_CERT_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBkDCCATagAwIBAgITPWYJaHMhQZLqM9irRRhFQTEKpDAKBggqhkjOPQQDAjAd
MRswGQYDVQQDDBJpbmZlcnEtdGVzdC1jbGllbnQwIBcNMjYxMTI5MDc0ODMyWhgP
MjEyNjExMDUwNzQ4MzJaMB0xGzAZBgNVBAMMEmluZmVycS10ZXN0LWNsaWVudDBZ
MBMGByqGSM49AgEGCCqGSM49AwEHA0IABN+ZuwnWenSX0oS+CWxAN9KeQrUsOCZF
W7FC+fr2r1pwxVAXfC0F5UEsYFTXnwjEJGNTKEMcyprqAZ54bB5oPEKjUzBRMB0G
A1UdDgQWBBQm+q0Hfwb+meLzT7d0Lgxht1lQtzAfBgNVHSMEGDAWgBQm+q0Hfwb+
meLzT7d0Lgxht1lQtzAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUC
IE2CcCEY+VPZ13n5xxxJPUeDuwgS8WkV6cMZWVnO5U15AiEAs/ZQIGS0eSHxOnlc
kqVOeJL50NngHazpd3ml7sGwTfY=
-----END CERTIFICATE-----
";
pub const TEST_CLIENT_KEY_PEM: &str = "-----BEGIN EC PARAMETERS-----
BggqhkjOPQMBBw==
-----END EC PARAMETERS-----
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgvD/nS0cogDf6LKBM
K59JVP6HtmJxj3iyZX6BfOaKxtChRANCAATfmbsJ1np0l9KEvglsQDfSnkK1LDgm
RVuxQvn69q9acMVQF3wtBeVBLGBU158IxCRjUyhDHMqa6gGeeGweaDxC
-----END PRIVATE KEY-----
";

pub fn temp_file(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    let written = std::fs::File::create(&path).and_then(|mut f| f.write_all(text.as_bytes()));
    assert!(written.is_ok(), "writing {}", path.display());
    path
}
