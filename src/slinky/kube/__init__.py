"""The controller runtime: informers, indexed stores, work queues, controllers, leader
election, events, conditions. Modelled on client-go / controller-runtime semantics."""
