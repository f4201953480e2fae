//! The request-transform file (`--transform-config-file`, go-compat §5.8):
//! `{"requestTransforms":[{"name":..,"type":..,"parameters":{..}}]}`. Names are non-empty and
//! unique; the one type is `gcs_uri_multipart` with `{"providers":[...]}` (non-empty, non-empty
//! strings). Out comes the ordered list of [`TransformSpec`]s the gateway layer builds its chain
//! from; errors name `transforms.<path>`.

use serde::Deserialize;
use serde_json::Value;

use super::json::{decode, decode_value};
use super::ConfigError;

/// The one transform type: a payload naming a GCS object by signed URL becomes a
/// multipart/form-data body.
pub const GCS_URI_MULTIPART: &str = "gcs_uri_multipart";

/// One configured transform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransformSpec {
    pub name: String,
    pub kind: TransformKind,
}

/// A transform's type and parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransformKind {
    /// Applies to requests whose `metadata.provider` is one of `providers`.
    GcsUriMultipart { providers: Vec<String> },
}

impl TransformKind {
    /// The type's name as the file spells it.
    pub fn type_name(&self) -> &'static str {
        match self {
            TransformKind::GcsUriMultipart { .. } => GCS_URI_MULTIPART,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(rename = "requestTransforms")]
    request_transforms: Option<Vec<RawTransform>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTransform {
    name: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    parameters: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGcsParams {
    providers: Option<Vec<String>>,
}

/// Decodes and checks the transform file's text.
pub(crate) fn parse_transforms(text: &str) -> Result<Vec<TransformSpec>, ConfigError> {
    let raw: RawFile = decode(
        text,
        "transforms",
        "--transform-config-file",
        &["", "requestTransforms[]"],
    )?;
    let mut specs: Vec<TransformSpec> = Vec::new();
    for (i, t) in raw
        .request_transforms
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let at = |field: &str| format!("transforms.requestTransforms[{i}].{field}");
        let name = t.name.unwrap_or_default();
        if name.is_empty() {
            return Err(ConfigError::invalid(at("name"), "required (non-empty)"));
        }
        if specs.iter().any(|s| s.name == name) {
            return Err(ConfigError::invalid(
                at("name"),
                format!("{name:?} is used by another transform"),
            ));
        }
        let kind = match t.kind.as_deref().unwrap_or("") {
            GCS_URI_MULTIPART => {
                let params = match t.parameters {
                    None | Some(Value::Null) => Value::Object(Default::default()),
                    Some(v) => v,
                };
                let p: RawGcsParams = decode_value(params, &at("parameters"))?;
                let providers = p.providers.unwrap_or_default();
                if providers.is_empty() {
                    return Err(ConfigError::invalid(
                        at("parameters.providers"),
                        "required: at least one provider",
                    ));
                }
                if let Some(j) = providers.iter().position(String::is_empty) {
                    return Err(ConfigError::invalid(
                        at(&format!("parameters.providers[{j}]")),
                        "must not be empty",
                    ));
                }
                TransformKind::GcsUriMultipart { providers }
            }
            "" => return Err(ConfigError::invalid(at("type"), "required")),
            other => {
                return Err(ConfigError::invalid(
                    at("type"),
                    format!("unknown transform type {other:?} (known: {GCS_URI_MULTIPART})"),
                ))
            }
        };
        specs.push(TransformSpec { name, kind });
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match parse_transforms(text) {
            Ok(t) => format!("ok {t:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_chain_in_file_order() {
        let t = parse_transforms(
            r#"{"requestTransforms":[
                {"name":"audio","type":"gcs_uri_multipart","parameters":{"providers":["openai"]}},
                {"name":"other","type":"gcs_uri_multipart","parameters":{"providers":["a","b"]}}]}"#,
        )
        .unwrap();
        assert_eq!(
            t,
            vec![
                TransformSpec {
                    name: "audio".into(),
                    kind: TransformKind::GcsUriMultipart {
                        providers: vec!["openai".into()]
                    }
                },
                TransformSpec {
                    name: "other".into(),
                    kind: TransformKind::GcsUriMultipart {
                        providers: vec!["a".into(), "b".into()]
                    }
                },
            ]
        );
        assert_eq!(parse_transforms("{}").unwrap(), vec![]);
    }

    #[test]
    fn rules_name_their_field() {
        let one = |t: &str| err(&format!(r#"{{"requestTransforms":[{t}]}}"#));
        assert_eq!(
            one(r#"{"type":"gcs_uri_multipart","parameters":{"providers":["p"]}}"#),
            "invalid config: transforms.requestTransforms[0].name: required (non-empty)"
        );
        assert_eq!(
            err(r#"{"requestTransforms":[
                {"name":"x","type":"gcs_uri_multipart","parameters":{"providers":["p"]}},
                {"name":"x","type":"gcs_uri_multipart","parameters":{"providers":["p"]}}]}"#),
            "invalid config: transforms.requestTransforms[1].name: \"x\" is used by another \
             transform"
        );
        assert_eq!(
            one(r#"{"name":"x","type":"resize"}"#),
            "invalid config: transforms.requestTransforms[0].type: unknown transform type \
             \"resize\" (known: gcs_uri_multipart)"
        );
        assert_eq!(
            one(r#"{"name":"x","type":"gcs_uri_multipart"}"#),
            "invalid config: transforms.requestTransforms[0].parameters.providers: required: at \
             least one provider"
        );
        assert_eq!(
            one(r#"{"name":"x","type":"gcs_uri_multipart","parameters":{"providers":["a",""]}}"#),
            "invalid config: transforms.requestTransforms[0].parameters.providers[1]: must not be \
             empty"
        );
        assert!(one(
            r#"{"name":"x","type":"gcs_uri_multipart","parameters":{"providers":["a"],"p":1}}"#
        )
        .starts_with(
            "invalid config: transforms.requestTransforms[0].parameters.p: unknown field"
        ));
        assert!(err(r#"{"transforms":[]}"#)
            .starts_with("invalid config: transforms.transforms: unknown field"));
    }
}
