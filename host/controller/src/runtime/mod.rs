//! Generic add-ons to kube-runtime that the controllers share, with nothing of NeoCloud Node's
//! domain in them: [`turns`] (a bounded number of objects reconciled at once, fairly, with a
//! trigger that wakes a waiting one), [`events`] (Events published as a kubelet and
//! controller-runtime write them, repeats folded into a series) and [`send_unread`].

pub mod events;
pub mod slim;
pub mod turns;

/// Sends a write whose answer nothing reads (a Pod's whole status, a created Event): the
/// answer is checked for an error, which comes back as the same `kube::Error::Api`, but not
/// decoded.
pub(crate) async fn send_unread(
    client: &kube::Client,
    request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> Result<(), kube::Error> {
    client
        .request_text(request.map_err(kube::Error::BuildRequest)?)
        .await?;
    Ok(())
}
