use crate::client::Call;
use crate::{Client, types};

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

impl<'c> Contexts<'c> {
    /// `GET /contexts`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub fn list(&self) -> Call<'c, Vec<types::ContextResponse>> {
        let client = self.client;
        Call::new(client.call_meta("list_contexts", client.api().list_contexts()))
    }

    /// `GET /contexts/{slug}` (slug or UUID).
    ///
    /// # Errors
    /// [`Error::Api`](crate::Error::Api) with status 404 for an unknown context.
    pub fn get<'a>(&self, slug: &'a str) -> Call<'a, types::ContextResponse>
    where
        'c: 'a,
    {
        let client = self.client;
        Call::new(client.call_meta("get_context", client.api().get_context(slug)))
    }

    /// `POST /contexts`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call (409 for a slug in use).
    pub fn create<'a>(
        &self,
        request: &'a types::CreateContextRequest,
    ) -> Call<'a, types::ContextResponse>
    where
        'c: 'a,
    {
        let client = self.client;
        Call::new(client.call_meta("create_context", client.api().create_context(request)))
    }

    /// `PUT /contexts/{slug}`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub fn update<'a>(
        &self,
        slug: &'a str,
        request: &'a types::UpdateContextRequest,
    ) -> Call<'a, types::ContextResponse>
    where
        'c: 'a,
    {
        let client = self.client;
        Call::new(client.call_meta("update_context", client.api().update_context(slug, request)))
    }

    /// `DELETE /contexts/{slug}`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub fn delete<'a>(&self, slug: &'a str) -> Call<'a, ()>
    where
        'c: 'a,
    {
        let client = self.client;
        Call::new(client.call_meta("delete_context", client.api().delete_context(slug)))
    }

    /// `POST /contexts/{slug}/curate`: starts curation as a task. Follow it
    /// with [`Tasks::wait`](crate::resources::Tasks::wait).
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call (409 while another workflow runs).
    pub fn curate<'a>(
        &self,
        slug: &'a str,
        options: &CurateOptions,
    ) -> Call<'a, types::WorkflowTriggerResponse>
    where
        'c: 'a,
    {
        let client = self.client;
        let body = types::CurateContextBody {
            batch_size: None,
            force: options.force,
            model: options.model.clone(),
            pinecone_api_key: None,
            scope: options.scope.clone(),
            trigger: None,
        };
        Call::new(async move {
            client
                .call_meta("curate_context", client.api().curate_context(slug, &body))
                .await
        })
    }
}
