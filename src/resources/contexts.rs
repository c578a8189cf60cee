use crate::{Client, Result, types};

/// Context calls. Get one from [`Client::contexts`].
#[derive(Debug, Clone, Copy)]
pub struct Contexts<'c> {
    pub(crate) client: &'c Client,
}

/// Options of `POST /contexts/{slug}/curate`.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CurateOptions {
    /// Re-curate sources that are already curated.
    pub force: bool,
    /// Only curate this subtree of the sources.
    pub scope: Option<String>,
    /// The model to curate with.
    pub model: Option<String>,
}

impl CurateOptions {
    /// Sets `force`.
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }
}

impl Contexts<'_> {
    /// `GET /contexts`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub async fn list(&self) -> Result<Vec<types::ContextResponse>> {
        self.client
            .call("list_contexts", self.client.api().list_contexts())
            .await
    }

    /// `GET /contexts/{slug}` (slug or UUID).
    ///
    /// # Errors
    /// [`Error::Api`](crate::Error::Api) with status 404 for an unknown context.
    pub async fn get(&self, slug: &str) -> Result<types::ContextResponse> {
        self.client
            .call("get_context", self.client.api().get_context(slug))
            .await
    }

    /// `POST /contexts`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call (409 for a slug in use).
    pub async fn create(
        &self,
        request: &types::CreateContextRequest,
    ) -> Result<types::ContextResponse> {
        self.client
            .call("create_context", self.client.api().create_context(request))
            .await
    }

    /// `PUT /contexts/{slug}`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub async fn update(
        &self,
        slug: &str,
        request: &types::UpdateContextRequest,
    ) -> Result<types::ContextResponse> {
        self.client
            .call(
                "update_context",
                self.client.api().update_context(slug, request),
            )
            .await
    }

    /// `DELETE /contexts/{slug}`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub async fn delete(&self, slug: &str) -> Result<()> {
        self.client
            .call("delete_context", self.client.api().delete_context(slug))
            .await
    }

    /// `POST /contexts/{slug}/curate`: starts curation as a task. Follow it
    /// with [`Tasks::wait`](crate::resources::Tasks::wait).
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call (409 while another workflow runs).
    pub async fn curate(
        &self,
        slug: &str,
        options: &CurateOptions,
    ) -> Result<types::WorkflowTriggerResponse> {
        let body = types::CurateContextBody {
            batch_size: None,
            force: options.force,
            model: options.model.clone(),
            pinecone_api_key: None,
            scope: options.scope.clone(),
            trigger: None,
        };
        self.client
            .call(
                "curate_context",
                self.client.api().curate_context(slug, &body),
            )
            .await
    }
}
