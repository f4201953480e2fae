//! Go's limit on redirects, on the reqwest path: the policy that follows nine and refuses the
//! tenth ([`stop_after`]), and the error that refusal leaves in reqwest's error chain
//! ([`TooManyRedirects`], naming the refused `Location`) for [`super::failure`] to word as Go
//! does.

/// Redirects followed; the next one fails the request. Go's default policy stops at the tenth
/// redirect ("stopped after 10 redirects"), so nine are followed (reqwest's default follows ten).
pub(super) const MAX_REDIRECTS: usize = 9;

/// A redirect policy that follows `redirects` redirects and refuses the next with
/// [`TooManyRedirects`], naming the Location it would not go to.
pub(super) fn stop_after(redirects: usize) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > redirects {
            let refused = TooManyRedirects(attempt.url().to_string());
            attempt.error(refused)
        } else {
            attempt.follow()
        }
    })
}

/// The redirect past the limit, with the Location it pointed to.
#[derive(Debug)]
pub(super) struct TooManyRedirects(pub(super) String);

impl std::fmt::Display for TooManyRedirects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "too many redirects (the last to {})", self.0)
    }
}

impl std::error::Error for TooManyRedirects {}

/// The [`TooManyRedirects`] somewhere in an error's chain.
pub(super) fn too_many_redirects<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a TooManyRedirects> {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(found) = e.downcast_ref::<TooManyRedirects>() {
            return Some(found);
        }
        source = e.source();
    }
    None
}
