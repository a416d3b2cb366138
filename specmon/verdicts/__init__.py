"""What a person is told: one typed finding per problem, gathered once for `check`, the webhook and the pages."""
