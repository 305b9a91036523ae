"""Root Query, Mutation and Subscription types: thin resolvers over the services."""
