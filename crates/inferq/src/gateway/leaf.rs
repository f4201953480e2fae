//! What Go's trust short cut ([`super::trust`]) needs to read from a server certificate that
//! webpki would not take as an end entity: its validity dates and whether its extended key usage
//! lets it serve TLS.
//!
//! The certificate's DER enters [`LeafFacts::read`]; the two dates (Unix seconds) and the usage
//! verdict leave, or `None` when the DER is not a certificate this walk can follow. Only the
//! fields up to the extensions are walked, by their fixed order in RFC 5280's `TBSCertificate`;
//! nothing is verified here (the certificate is one the operator listed in `--tls-ca-cert`, and
//! the handshake's signature is checked against its key as for any other).

/// `id-ce-extKeyUsage` (2.5.29.37), as its DER content bytes.
const EXT_KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x25];
/// `id-kp-serverAuth` (1.3.6.1.5.5.7.3.1).
const SERVER_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01];
/// `anyExtendedKeyUsage` (2.5.29.37.0).
const ANY_USAGE: &[u8] = &[0x55, 0x1d, 0x25, 0x00];

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const OID: u8 = 0x06;
const BOOLEAN: u8 = 0x01;
const OCTET_STRING: u8 = 0x04;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
/// `[0] EXPLICIT Version`, and `[3] EXPLICIT Extensions`.
const VERSION: u8 = 0xa0;
const EXTENSIONS: u8 = 0xa3;

/// The facts about one certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeafFacts {
    /// `notBefore`, Unix seconds.
    pub not_before: u64,
    /// `notAfter`, Unix seconds.
    pub not_after: u64,
    /// No extended key usage, or one that names `serverAuth` or any usage (Go's rule for a
    /// server certificate).
    pub serves_tls: bool,
}

impl LeafFacts {
    /// Reads the facts from a certificate's DER; `None` if it cannot be followed.
    pub(crate) fn read(der: &[u8]) -> Option<LeafFacts> {
        let mut outer = der;
        let mut certificate = expect(&mut outer, SEQUENCE)?;
        let mut tbs = expect(&mut certificate, SEQUENCE)?;
        if peek(tbs) == Some(VERSION) {
            next(&mut tbs)?;
        }
        expect(&mut tbs, INTEGER)?; // serialNumber
        expect(&mut tbs, SEQUENCE)?; // signature
        expect(&mut tbs, SEQUENCE)?; // issuer
        let mut validity = expect(&mut tbs, SEQUENCE)?;
        let not_before = time(&mut validity)?;
        let not_after = time(&mut validity)?;
        expect(&mut tbs, SEQUENCE)?; // subject
        expect(&mut tbs, SEQUENCE)?; // subjectPublicKeyInfo
        let mut serves_tls = true;
        while let Some((tag, mut body)) = next(&mut tbs) {
            if tag != EXTENSIONS {
                continue; // issuerUniqueID, subjectUniqueID
            }
            let mut extensions = expect(&mut body, SEQUENCE)?;
            while !extensions.is_empty() {
                let mut extension = expect(&mut extensions, SEQUENCE)?;
                let id = expect(&mut extension, OID)?;
                if peek(extension) == Some(BOOLEAN) {
                    next(&mut extension)?;
                }
                let mut value = expect(&mut extension, OCTET_STRING)?;
                if id == EXT_KEY_USAGE {
                    let mut usages = expect(&mut value, SEQUENCE)?;
                    serves_tls = false;
                    while !usages.is_empty() {
                        let usage = expect(&mut usages, OID)?;
                        serves_tls |= usage == SERVER_AUTH || usage == ANY_USAGE;
                    }
                }
            }
        }
        Some(LeafFacts {
            not_before,
            not_after,
            serves_tls,
        })
    }
}

fn peek(input: &[u8]) -> Option<u8> {
    input.first().copied()
}

/// The next TLV of `input` (tag and content), advancing past it.
fn next<'a>(input: &mut &'a [u8]) -> Option<(u8, &'a [u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b))
    };
    if rest.len() < length {
        return None;
    }
    let (content, after) = rest.split_at(length);
    *input = after;
    Some((tag, content))
}

/// The next TLV's content, if it has tag `want`.
fn expect<'a>(input: &mut &'a [u8], want: u8) -> Option<&'a [u8]> {
    match next(input)? {
        (tag, content) if tag == want => Some(content),
        _ => None,
    }
}

/// A `Time` (UTCTime `YYMMDDHHMMSSZ`, years 1950–2049, or GeneralizedTime `YYYYMMDDHHMMSSZ`)
/// as Unix seconds.
fn time(input: &mut &[u8]) -> Option<u64> {
    let (tag, text) = next(input)?;
    let (year, rest) = match tag {
        UTC_TIME => {
            let yy = digits(text.get(..2)?)?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, text.get(2..)?)
        }
        GENERALIZED_TIME => (digits(text.get(..4)?)?, text.get(4..)?),
        _ => return None,
    };
    if rest.len() != 11 || rest.get(10) != Some(&b'Z') {
        return None;
    }
    let field = |at: usize| rest.get(at..at + 2).and_then(digits);
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let days = days_since_epoch(year, month, day)?;
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second.min(60))
}

fn digits(text: &[u8]) -> Option<u64> {
    text.iter().try_fold(0u64, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + u64::from(c - b'0'))
    })
}

/// Days from 1970-01-01 to a civil date (proleptic Gregorian), for dates from 1970 on.
fn days_since_epoch(year: u64, month: u64, day: u64) -> Option<u64> {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let of_era = year - era * 400;
    let shifted_month = (month + 9) % 12;
    let of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let of_era_days = of_era * 365 + of_era / 4 - of_era / 100 + of_year;
    (era * 146_097 + of_era_days).checked_sub(719_468)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    /// A self-signed server certificate as `openssl req -x509` makes it: marked as a CA, names
    /// 127.0.0.1 and localhost, no extended key usage; valid from 2026-11-29 20:56:33 UTC
    /// (UTCTime) to 2126-11-05 20:56:33 UTC (GeneralizedTime). Tests only.
    pub(crate) const SELF_SIGNED_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBrjCCAVOgAwIBAgIUVMD+CRf8jahkQ1eXjQIU5jO1O78wCgYIKoZIzj0EAwIw
HTEbMBkGA1UEAwwSaW5mZXJxLXRlc3Qtc2VydmVyMCAXDTI2MTEyOTIwNTYzM1oY
DzIxMjYxMTA1MjA1NjMzWjAdMRswGQYDVQQDDBJpbmZlcnEtdGVzdC1zZXJ2ZXIw
WTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAATBxF51Jre2iwXNDajW4V1O9aFsbaIQ
P+EPckZ9hT6n8qZ/U2HjlvGlfwUIqfzWrU5UVyY7/YG9ngJ/Fbuw2h3uo28wbTAd
BgNVHQ4EFgQUVKCcA4IEm/1pk/p9RjcO8zPFu1gwHwYDVR0jBBgwFoAUVKCcA4IE
m/1pk/p9RjcO8zPFu1gwDwYDVR0TAQH/BAUwAwEB/zAaBgNVHREEEzARhwR/AAAB
gglsb2NhbGhvc3QwCgYIKoZIzj0EAwIDSQAwRgIhAKnE3VtVcjcze6GCxlmKK4hK
wZ9VIxrFcT0Jtu09Ut2fAiEA36mGAwLAuOmlQmTI9PQs8pMdl2z6zQe+dg/Wflf1
gxg=
-----END CERTIFICATE-----
";
    /// The key of [`SELF_SIGNED_PEM`].
    pub(crate) const SELF_SIGNED_KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgkv0VtV4PSRTft7IB
5ZRcyvyWFw53x+9u/2odcdrGqxGhRANCAATBxF51Jre2iwXNDajW4V1O9aFsbaIQ
P+EPckZ9hT6n8qZ/U2HjlvGlfwUIqfzWrU5UVyY7/YG9ngJ/Fbuw2h3u
-----END PRIVATE KEY-----
";
    /// Like [`SELF_SIGNED_PEM`] but its extended key usage is `clientAuth` only. Tests only.
    pub(crate) const CLIENT_ONLY_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBzTCCAXSgAwIBAgIUCY+KFTfcBjQNucwoLD4W9arj2GwwCgYIKoZIzj0EAwIw
IjEgMB4GA1UEAwwXaW5mZXJxLXRlc3QtY2xpZW50LW9ubHkwIBcNMjYxMTI5MjEw
MDM1WhgPMjEyNjExMDUyMTAwMzVaMCIxIDAeBgNVBAMMF2luZmVycS10ZXN0LWNs
aWVudC1vbmx5MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEufe6fyZ3Kenq943h
LeEco7z3E4PfsrSRDWp9K4JC2TQuSn4H13EJmJ4b6qLIA/r31Dq8aXGqi7obi0xy
Fl73jaOBhTCBgjAdBgNVHQ4EFgQUoPVTrEDN+1v1hco/4bzTqt2B7dQwHwYDVR0j
BBgwFoAUoPVTrEDN+1v1hco/4bzTqt2B7dQwDwYDVR0TAQH/BAUwAwEB/zAaBgNV
HREEEzARhwR/AAABgglsb2NhbGhvc3QwEwYDVR0lBAwwCgYIKwYBBQUHAwIwCgYI
KoZIzj0EAwIDRwAwRAIga1ZJ1aCBMaxNXQYE5f5IPs8RIxemURsBp4GBM24HzjgC
IEf8e4KZw+7nxzOqMGnZDunGpzwRIEDH/Pyy846IrhxG
-----END CERTIFICATE-----
";

    pub(crate) fn der(pem: &str) -> CertificateDer<'static> {
        match CertificateDer::from_pem_slice(pem.as_bytes()) {
            Ok(der) => der,
            Err(e) => panic!("test certificate: {e}"),
        }
    }

    #[test]
    fn reads_the_dates_in_both_time_forms_and_the_usage() {
        // `date -d "Nov 29 20:56:33 2026 GMT" +%s` and `date -d "Nov 5 20:56:33 2126 GMT" +%s`.
        assert_eq!(
            LeafFacts::read(&der(SELF_SIGNED_PEM)),
            Some(LeafFacts {
                not_before: 1_795_985_793,
                not_after: 4_949_585_793,
                serves_tls: true,
            })
        );
        let client_only = LeafFacts::read(&der(CLIENT_ONLY_PEM));
        assert_eq!(client_only.map(|f| f.serves_tls), Some(false));
    }

    #[test]
    fn a_cut_or_foreign_der_is_not_followed() {
        let whole = der(SELF_SIGNED_PEM);
        for cut in [0, 1, 10, 100, whole.len() - 1] {
            assert_eq!(LeafFacts::read(&whole[..cut]), None, "cut at {cut}");
        }
        assert_eq!(LeafFacts::read(b"\x02\x01\x00"), None);
    }

    #[test]
    fn civil_dates_count_days_as_the_calendar_does() {
        assert_eq!(days_since_epoch(1970, 1, 1), Some(0));
        assert_eq!(days_since_epoch(2000, 3, 1), Some(11_017));
        assert_eq!(days_since_epoch(2024, 2, 29), Some(19_782));
        assert_eq!(days_since_epoch(2100, 3, 1), Some(47_541));
    }
}
