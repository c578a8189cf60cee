use crate::{Client, Result, types};

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
    pub async fn list_page(
        &self,
        path: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> Result<types::DirListing> {
        let api = self.client.api();
        match path.filter(|p| !p.is_empty()) {
            Some(p) => {
                self.client
                    .call(
                        "list_knowledge_by_path",
                        api.list_knowledge_by_path(self.slug, p, limit, offset),
                    )
                    .await
            }
            None => {
                self.client
                    .call(
                        "list_knowledge",
                        api.list_knowledge(self.slug, limit, offset),
                    )
                    .await
            }
        }
    }

    /// `GET /contexts/{slug}/knowledge/read/{path}`: a curated file's bytes.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub async fn read(&self, path: &str) -> Result<bytes::Bytes> {
        let stream = self
            .client
            .call(
                "read_knowledge_file",
                self.client.api().read_knowledge_file(self.slug, path),
            )
            .await?;
        super::sources::collect_stream("read_knowledge_file", stream).await
    }
}
