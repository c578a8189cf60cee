use crate::client::Call;
use crate::{Client, types};

/// Curated knowledge of one context. Get one from [`Client::knowledge`].
#[derive(Debug, Clone, Copy)]
pub struct Knowledge<'c> {
    pub(crate) client: &'c Client,
    pub(crate) slug: &'c str,
}

impl<'c> Knowledge<'c> {
    /// `GET /contexts/{slug}/knowledge/list[/{path}]`: every entry of a
    /// directory (the root unless [`ListFiles::path`](super::ListFiles::path)
    /// names one), following the pages. `.await` it for the entries, or read
    /// [`ListFiles::pages`](super::ListFiles::pages).
    pub fn list(&self) -> super::ListFiles<'c> {
        super::ListFiles::new(self.client, super::pages::Tree::Knowledge, self.slug)
    }

    /// One page of entries, as the API returns it.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub fn list_page(
        &self,
        path: Option<&'c str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> Call<'c, types::DirListing> {
        let (client, slug) = (self.client, self.slug);
        Call::new(async move {
            let api = client.api();
            match path.filter(|p| !p.is_empty()) {
                Some(p) => {
                    client
                        .call_meta(
                            "list_knowledge_by_path",
                            api.list_knowledge_by_path(slug, p, limit, offset),
                        )
                        .await
                }
                None => {
                    client
                        .call_meta("list_knowledge", api.list_knowledge(slug, limit, offset))
                        .await
                }
            }
        })
    }

    /// `GET /contexts/{slug}/knowledge/read/{path}`: a curated file's bytes.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub fn read<'a>(&self, path: &'a str) -> Call<'a, bytes::Bytes>
    where
        'c: 'a,
    {
        let (client, slug) = (self.client, self.slug);
        Call::new(async move {
            let (stream, meta) = client
                .call_meta(
                    "read_knowledge_file",
                    client.api().read_knowledge_file(slug, path),
                )
                .await?;
            Ok((
                super::sources::collect_stream("read_knowledge_file", stream).await?,
                meta,
            ))
        })
    }
}
